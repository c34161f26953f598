"""`BackendSettings`: defaults < `TABLOOP_BACKEND_*` < the flags given to `tabloop backend`."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.cli import _serve_parser, _trainer_parser, backend_settings, serving_settings
from backend.settings import BackendSettings

PG = "postgresql+psycopg://user:pass@db/tabloop"


@pytest.mark.parametrize(
    ("environ", "argv", "read", "expected"),
    [
        pytest.param({}, [], lambda s: s.port, 8765, id="default"),
        pytest.param({"TABLOOP_BACKEND_PORT": "9000"}, [], lambda s: s.port, 9000, id="env"),
        pytest.param(
            {"TABLOOP_BACKEND_PORT": "9000"}, ["--port", "9100"], lambda s: s.port, 9100, id="flag"
        ),
        pytest.param(
            {"TABLOOP_BACKEND_LIMITS__BURST_EVENTS": "50"},
            ["--rate", "5"],
            lambda s: (s.limits.rate_events_per_s, s.limits.burst_events),
            (5.0, 50.0),
            id="a-section-merges-env-and-flag",
        ),
        pytest.param(
            {"TABLOOP_BACKEND_TRAINER__INTERVAL_S": "7"},
            ["--lambda", "0.5"],
            lambda s: (s.trainer.interval_s, s.trainer.rewards.distraction_cost),
            (7.0, 0.5),
            id="trainer",
        ),
        pytest.param(
            {"TABLOOP_BACKEND_ADAPTERS__EVERY_S": "60"},
            [],
            lambda s: s.adapters.enabled,
            True,
            id="adapters-from-env",
        ),
        pytest.param(
            {"TABLOOP_BACKEND_WORKER_ARGS": "[]"}, [], lambda s: s.workers, 1, id="not-a-setting"
        ),
    ],
)
def test_the_layers(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], argv: list[str], read, expected
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert read(backend_settings(_serve_parser().parse_args(argv))) == expected


def test_the_cache_directory_is_resolved_once_as_every_command_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(tmp_path / "cache"))
    assert BackendSettings().cache_dir == tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_BACKEND_CACHE_DIR", str(tmp_path / "backend"))
    assert BackendSettings().cache_dir == tmp_path / "backend"


def test_the_command_chooses_for_the_database() -> None:
    sqlite = serving_settings(_serve_parser().parse_args([]), migrate=True, train=True)
    assert sqlite.failover_s is None and sqlite.shared_rate_limits is False and sqlite.train
    postgres = serving_settings(_serve_parser().parse_args(["--db", PG]), migrate=False, train=True)
    assert postgres.failover_s == 30.0 and postgres.shared_rate_limits is True
    assert not postgres.migrate
    local = serving_settings(
        _serve_parser().parse_args(["--db", PG, "--rate-limits", "local", "--failover", "9"]),
        migrate=True,
        train=False,
    )
    assert local.shared_rate_limits is False and local.failover_s == 9.0
    with pytest.raises(SystemExit):
        serving_settings(
            _serve_parser().parse_args(["--rate-limits", "shared"]), migrate=True, train=True
        )
    trainer = backend_settings(_trainer_parser().parse_args(["--db", PG, "--adapters"]))
    # The default schedule (on); a trainer process never schedules, it claims the jobs.
    assert trainer.postgres and trainer.adapters.enabled


def test_a_bad_value_in_the_environment_ends_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLOOP_BACKEND_PORT", "many")
    with pytest.raises(SystemExit, match="port"):
        backend_settings(_serve_parser().parse_args([]))
