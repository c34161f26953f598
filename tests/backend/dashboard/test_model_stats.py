"""Statistics by model (adapter) version, on the real backend on loopback and both databases:
`/v1/stats/by/model` splits the figures by the version each decision carries (events of older
clients, without one, are "(unknown)"), the Overview puts the adapter transitions on the time
axis, and `tabloop stats --by model` prints the same split."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.adapters.run import tenant_registry
from backend.stats_cli import stats_main
from tests.support.backend_server import BackendServer
from tests.support.fake_adapter import FAKE_BASE_MODEL, fake_adapter
from tests.support.model_events import shown

# (model_version, shown, accepted): every decision is shown; `accepted` of them are accepted.
ARMS = (("v0001", 30, 6), ("v0002", 20, 12), (None, 10, 1))


def _events(now: datetime) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for version, count, accepted in ARMS:
        for n in range(count):
            kind = "accepted" if n < accepted else "ignored"
            time = now - timedelta(minutes=30) + timedelta(seconds=n)
            events += shown(version, kind, time, chars=10)
    return events


@pytest.fixture
def with_models(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BackendServer]:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    with BackendServer(db_url) as backend:
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        for fill in (1, 2):
            registry.add(fake_adapter(tmp_path / f"a{fill}", fill), FAKE_BASE_MODEL, {})
        registry.promote(1, force=True)
        registry.promote(2, force=True, canary_share=0.2)
        registry.finish_canary(promote=True, version=2, actor="canary", reason="promote: test")
        answer = httpx.post(
            backend.url + "/v1/events",
            json={"events": _events(datetime.now(UTC))},
            headers={"Authorization": f"Bearer {backend.token}"},
            timeout=30,
        )
        answer.raise_for_status()
        assert not answer.json()["rejected"], answer.text
        yield backend


def _get(backend: BackendServer, path: str, **params: str) -> Any:
    answer = httpx.get(
        backend.url + path,
        params=params,
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def test_figures_split_by_model_version(with_models: BackendServer) -> None:
    doc = _get(with_models, "/v1/stats/by/model", window="1h")
    rows = {row["value"]: row for row in doc["rows"]}
    assert set(rows) == {"v0001", "v0002", "(unknown)"}
    for version, count, accepted in ARMS:
        row = rows[version or "(unknown)"]
        assert (row["shown"], row["accepted"]) == (count, accepted)
        assert row["accept_rate"] == pytest.approx(accepted / count)
        assert row["accepted_chars"] == 10 * accepted
    assert set(doc["series"]["values"]) == set(rows)


def test_model_promotions_and_rollbacks_are_on_the_time_axis(with_models: BackendServer) -> None:
    doc = _get(with_models, "/v1/stats/overview", window="1h")
    actions = [(m["action"], m["version"]) for m in doc["model_markers"]]
    assert actions == [("promote", "v0001"), ("canary", "v0002"), ("canary-promote", "v0002")]
    assert doc["model_markers"][-1]["actor"] == "canary"
    # Bands are whole seconds: v0001's, a moment long here, may have none.
    bands = [band["version"] for band in doc["model_bands"]]
    assert bands[0] == "base" and bands[-1] == "v0002" and set(bands) <= {"base", "v0001", "v0002"}
    assert doc["model_serving"] == "v0002"
    assert doc["start"] <= doc["model_markers"][0]["t"] < doc["end"]


def test_tabloop_stats_splits_by_model(
    with_models: BackendServer, capsys: pytest.CaptureFixture[str]
) -> None:
    if with_models.storage.dialect != "sqlite":
        pytest.skip("the command's own database is enough on SQLite")
    url = str(with_models.storage.url)
    assert stats_main(["--db", url, "--tenant", with_models.tenant, "--by", "model", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["value"]: row["shown"] for row in doc["split"]["rows"]}
    assert rows == {"v0001": 30, "v0002": 20, "(unknown)": 10}
    assert doc["model_serving"] == "v0002" and len(doc["model_markers"]) == 3
    assert stats_main(["--db", url, "--tenant", with_models.tenant, "--by", "model"]) == 0
    table = capsys.readouterr().out
    assert "v0002" in table and "model promotions and rollbacks" in table
