"""The `tabloop` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lsp_server import __version__
from lsp_server.oneshot import parse_location

SOURCE = "def double(value):\n    return \n"


def tabloop(
    *args: str, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tabloop", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def isolated_env(tmp_path: Path, tiny_model_path: Path) -> dict[str, str]:
    return {
        "TABLOOP_CACHE_DIR": str(tmp_path / "cache"),
        "TABLOOP_COMPLETION__MODEL": str(tiny_model_path),
        "TABLOOP_TELEMETRY": "off",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def test_version() -> None:
    assert tabloop("--version").stdout.strip() == f"tabloop {__version__}"
    assert tabloop("serve", "--version").stdout.strip() == f"tabloop {__version__}"


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        pytest.param("a.py:1:1", (Path("a.py"), 0, 0), id="start"),
        pytest.param("dir/b.py:12:5", (Path("dir/b.py"), 11, 4), id="one-based"),
        pytest.param("c:/x.py:3:2", (Path("c:/x.py"), 2, 1), id="colon-in-path"),
    ],
)
def test_parse_location(location: str, expected: tuple[Path, int, int]) -> None:
    assert parse_location(location) == expected


@pytest.mark.parametrize("location", ["a.py", "a.py:0:1", "a.py:x:1", "a.py:1"])
def test_parse_location_rejects(location: str) -> None:
    with pytest.raises(ValueError):
        parse_location(location)


def test_complete_explains_a_bad_location(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    result = tabloop("complete", f"{tmp_path / 'missing.py'}:1:1", env=isolated_env)
    assert result.returncode == 2
    assert "missing.py" in result.stderr and result.stdout == ""


def test_doctor_reports_settings_with_their_sources(
    tmp_path: Path, isolated_env: dict[str, str]
) -> None:
    (tmp_path / "tabloop.toml").write_text("[completion]\nmax_new_tokens = 9\n", encoding="utf-8")
    result = tabloop("doctor", "--json", "--workspace", str(tmp_path), env=isolated_env)
    report = json.loads(result.stdout)
    assert report["settings"]["completion.max_new_tokens"] == {"value": 9, "source": "workspace"}
    assert report["settings"]["completion.model"]["source"] == "environment"
    assert report["cache_dir"]["writable"] is True
    assert result.returncode == (1 if report["problems"] else 0)


def test_doctor_says_which_engine_runs_the_model(
    tmp_path: Path, isolated_env: dict[str, str]
) -> None:
    result = tabloop("doctor", "--workspace", str(tmp_path), env=isolated_env)
    engine = next(
        line for line in result.stdout.splitlines() if line.startswith("completion engine:")
    )
    status = json.loads(engine.split(":", 1)[1])
    assert status["requested"] == "auto" and status["engine"] == "onnxruntime"
    assert status["compute_type"] == "int8" and status["engine_version"]
    assert "onnxruntime-genai" in result.stdout


def test_doctor_names_a_bad_setting(tmp_path: Path, isolated_env: dict[str, str]) -> None:
    env = {**isolated_env, "TABLOOP_COMPLETION__TEMPERATURE": "hot"}
    result = tabloop("doctor", "--json", "--workspace", str(tmp_path), env=env)
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert any("temperature" in problem for problem in report["problems"])


def test_serve_writes_nothing_but_json_rpc_to_stdout(isolated_env: dict[str, str]) -> None:
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
    message = f"Content-Length: {len(request)}\r\n\r\n{request}"
    exit_note = json.dumps({"jsonrpc": "2.0", "method": "exit"})
    message += f"Content-Length: {len(exit_note)}\r\n\r\n{exit_note}"
    result = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--stdio", "-vv"],
        input=message.encode(),
        capture_output=True,
        timeout=120,
        env={**os.environ, **isolated_env},
        check=False,
    )
    # Exactly one framed JSON-RPC message, and nothing else: the answer to `shutdown`, which
    # before `initialize` is ServerNotInitialized (-32002), as the LSP specification says.
    header, body = result.stdout.split(b"\r\n\r\n", 1)
    fields = dict(line.split(b": ", 1) for line in header.split(b"\r\n"))
    assert int(fields[b"Content-Length"]) == len(body)
    answer = json.loads(body)
    assert answer["id"] == 1 and answer["error"]["code"] == -32002
    assert b"listening" in result.stderr  # the logs went to stderr


def test_every_benchmark_module_is_a_bench_command() -> None:
    from tabloop.cli import BENCHMARKS, _bench

    bench_dir = Path(__file__).parents[2] / "evaluation" / "bench"
    modules = {p.stem for p in bench_dir.glob("*.py") if p.stem != "__init__"}
    # A command's words are joined by dashes, its module's by underscores.
    assert {module.replace("_", "-") for module in modules} == set(BENCHMARKS)
    for module in sorted(modules):
        assert _bench(module.replace("_", "-")).__module__ == f"evaluation.bench.{module}"


def test_bench_list_names_what_make_bench_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from tabloop.cli import BENCHMARKS, main

    assert main(["bench", "--list", "make"]) == 0
    made = capsys.readouterr().out.split()
    assert made == [name for name, bench in BENCHMARKS.items() if bench.make]
    assert "lsp" in made and "scale" not in made  # PostgreSQL and several instances: not routine
    assert main(["bench", "--list"]) == 0
    assert capsys.readouterr().out.split() == list(BENCHMARKS)
