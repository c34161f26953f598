"""`tabloop train` and `tabloop policy` on a real database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from backend.policy_cli import policy_main, train_main
from backend.storage import Storage
from completion.gate import builtin_policy
from telemetry.events import parse_event
from tests.backend.policy.synthetic import Logger, contexts, to_events


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'backend.sqlite3'}"
    storage = Storage(url)
    tenant = storage.ensure_tenant("acme")
    start = datetime.now(UTC) - timedelta(hours=1)
    logged = Logger(builtin_policy(), seed=4).log(contexts(2000, seed=3), start=start)
    storage.insert_events(tenant, [parse_event(e) for e in to_events(logged)])
    storage.close()
    return url


def test_train_then_list_promote_and_rollback(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(["--db", db, "--json", "--min-events", "100"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["candidate"] == "v1"
    assert run["report"]["holdout_events"] == 600

    if run["promoted"]:
        # A promotion starts a canary (10% by default): the next run only judges it, and with
        # no live decisions yet it waits; a rollback by hand ends it.
        assert run["state"] == "canary"
        assert train_main(["--db", db, "--tenant", "acme", "--min-events", "100"]) == 0
        assert "canary v1 is still being judged" in capsys.readouterr().out
        assert policy_main(["list", "--db", db, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["versions"][0]["state"] == "canary"
        assert policy_main(["rollback", "--db", db]) == 0
        assert capsys.readouterr().out.strip() == "serving builtin"
    assert train_main(["--db", db, "--tenant", "acme", "--min-events", "100"]) == 0
    assert "v2" in capsys.readouterr().out

    assert policy_main(["list", "--db", db, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in listing["versions"]] == ["v1", "v2"]
    assert listing["serving"] in ("builtin", "v1", "v2")  # promotion depends on the evidence

    assert policy_main(["promote", "v1", "--db", db]) == 0
    assert policy_main(["promote", "v2", "--db", db]) == 0
    assert policy_main(["rollback", "--db", db]) == 0
    assert capsys.readouterr().out.strip().endswith("serving v1")
    assert policy_main(["list", "--db", db]) == 0
    assert "* v1" in capsys.readouterr().out
    assert policy_main(["promote", "v7", "--db", db]) == 1


def test_backend_command_line_sets_the_scheduled_trainer() -> None:
    from backend.cli import _serve_parser, trainer_settings

    default = trainer_settings(_serve_parser().parse_args([]))
    assert default.rewards.distraction_cost == 1.0 and default.interval_s == 60.0
    chosen = trainer_settings(
        _serve_parser().parse_args(["--lambda", "0.03", "--train-interval", "5"])
    )
    assert chosen.rewards.distraction_cost == 0.03 and chosen.interval_s == 5.0
    for bad in (["--lambda", "-1"], ["--lambda", "nan"], ["--train-interval", "0"]):
        with pytest.raises(SystemExit):
            _serve_parser().parse_args(bad)


@pytest.mark.parametrize(
    "command", [pytest.param("train", id="train"), pytest.param("list", id="list")]
)
def test_a_tenant_name_a_new_tenant_may_not_have_is_refused_cleanly(db: str, command: str) -> None:
    argv = ["--tenant", "bad name", "--db", db]
    with pytest.raises(SystemExit, match="no whitespace"):
        train_main(argv) if command == "train" else policy_main(["list", *argv])
