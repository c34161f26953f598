"""The real server trains the workspace's next adapter by itself, yields to typing, and resumes
a killed run after a restart.

Each test starts `python -m lsp_server --stdio` with the tiny model and a training section whose
thresholds are tiny, so a run starts at once; the run is the real `tabloop train model` in a
child process. What the child does is read from /proc (its state, `T` when stopped) and from
`tabloop/status`; waits end on what they wait for, with a generous limit only against hanging.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import sysconfig
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient
from pytest_lsp.client import make_test_lsp_client

from lsp_server.config import Settings
from lsp_server.features.edit_learning import EditLearningFeature
from lsp_server.features.training_loop import TrainingLoopFeature
from lsp_server.protocol import (
    NEXT_EDIT_TIMINGS_REQUEST,
    TABLOOP_NEXT_EDIT_REQUEST,
    TRAINING_PROGRESS_TITLE,
    plain,
)
from tests.lsp_server.conftest import load_profile
from tests.support.feature_server import feature_server
from tests.support.git_repo import git, make_repo
from training.background import (
    INTERRUPTED,
    OVER_MEMORY,
    STATE_DIR,
    STATE_FILE,
    Activity,
    next_run,
    wait_reason,
)
from training.edit_examples import EditExample
from training.edit_track import edit_registry
from training.registry import RUN_DIR, scope_dir
from training.trainer import CHECKPOINTS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
IDLE = Activity(0, None, 0.0)
WAIT_S = 300.0  # not stuck: loading, converting and training the tiny model on a busy CPU


@pytest.mark.parametrize(
    ("layer", "why"),
    [
        pytest.param({}, None, id="the-defaults-train"),
        pytest.param({"training": {"auto": False}}, "training.auto is off", id="turned-off"),
        pytest.param({"completion": {"enabled": False}}, "completion.enabled", id="no-completion"),
        pytest.param({"completion": {"runner": "http"}}, "http runner", id="http-runner"),
        pytest.param({"completion": {"adapter": "/a"}}, "completion.adapter", id="named-adapter"),
        pytest.param(
            {"completion": {"adapterSource": "backend"}}, "backend's adapter", id="backend-serves"
        ),
    ],
)
def test_the_loop_is_off_where_a_trained_version_could_not_serve(
    tmp_path: Path, layer: dict[str, Any], why: str | None
) -> None:
    server = feature_server(tmp_path)
    feature = TrainingLoopFeature(server)  # type: ignore[arg-type]
    feature.on_settings(Settings.model_validate({"cacheDir": str(tmp_path / "cache"), **layer}))
    part = feature.status_parts()["training"]
    if why is None:
        assert part["state"] == "waiting", part
        assert part["reason"] == "the completion model to load"
    else:
        assert part["state"] == "off" and why in part["reason"], part
    server.workspace_root = None
    assert feature.why_off(Settings()) == "the server has no workspace root"


def test_next_edit_examples_kept_since_the_last_run_are_new_material(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text(SOURCE, encoding="utf-8")
    server = feature_server(tmp_path)
    server.settings = Settings.model_validate(
        {
            "cacheDir": str(tmp_path / "cache"),
            "training": {"minNewEditExamples": 3, "minChangedFiles": 50},
        }
    )
    learning = server.add_feature(EditLearningFeature(server))  # type: ignore[arg-type]
    loop = TrainingLoopFeature(server)  # type: ignore[arg-type]
    learning.on_settings(server.settings)
    loop.on_settings(server.settings)
    assert learning.store is not None
    example = EditExample("a.py", "prompt", "x = 1\n", "x = 2\n", "live")
    for _ in range(2):
        learning.store.record(example)
    material = loop._material()
    assert (material.new_edit_examples, material.changed_files) == (2, 1)
    reason = wait_reason(server.settings.training, material, IDLE, loop.record, time.time())
    assert reason is not None and "2 of 3 next-edit examples" in reason
    learning.store.record(example)
    material = loop._material()
    assert material.new_edit_examples == 3
    assert wait_reason(server.settings.training, material, IDLE, loop.record, time.time()) is None
    # A run that started after them read them: they are not new any more.
    loop.record.edits_upto = learning.store.last_id()
    assert loop._material().new_edit_examples == 0
    learning.on_shutdown()


def test_next_edits_train_apart_where_they_have_a_runner_of_their_own(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ids = make_repo(root, [{"a.py": f"x = {n}\n"} for n in range(4)])
    server = feature_server(tmp_path)
    server.settings = Settings.model_validate(
        {
            "cacheDir": str(tmp_path / "cache"),
            "nextEdit": {"engine": "torch-bfloat16"},
            "training": {"minNewEditExamples": 2, "minNewCommits": 3, "minChangedFiles": 50},
        }
    )
    learning = server.add_feature(EditLearningFeature(server))  # type: ignore[arg-type]
    loop = TrainingLoopFeature(server)  # type: ignore[arg-type]
    learning.on_settings(server.settings)
    loop.on_settings(server.settings)
    assert learning.store is not None and loop.edit_track()
    assert loop.status_parts()["training"]["nextEditTrack"] is True
    example = EditExample("a.py", "prompt", "x = 1\n", "x = 2\n", "live")
    learning.store.record(example)
    # Kept edits are the next-edit track's material, not the completion adapter's.
    assert loop._material().new_edit_examples == 0
    edits = loop._edit_material()
    assert (edits.new_edit_examples, edits.new_commits, edits.unfinished) == (1, 3, False)
    task, why = next_run(server.settings.training, loop._material(), edits, IDLE, loop.record, 0)
    assert task == "next-edit" and why == ""
    # A next-edit run started at the head: only later commits are new.
    loop.record.edits_head, loop.record.edits_upto = ids[-1], learning.store.last_id()
    edits = loop._edit_material()
    assert (edits.new_edit_examples, edits.new_commits) == (0, 0)
    git(root, "commit", "-q", "--allow-empty", "-m", "no python")
    (root / "a.py").write_text("x = 9\n", encoding="utf-8")
    git(root, "commit", "-qam", "python")
    assert loop._edit_material().new_commits == 1
    task, why = next_run(
        server.settings.training, loop._material(), loop._edit_material(), IDLE, loop.record, 0
    )
    assert task is None and "next edits: new material" in why and "1 of 3 new commits" in why
    # A head the history no longer has (rewritten): counted from none, up to the threshold.
    loop.record.edits_head = "0" * 40
    assert loop._edit_material().new_commits == 3
    # With next edits on the engine's runner, one adapter learns both again.
    server.settings = Settings.model_validate(
        {"cacheDir": str(tmp_path / "cache"), "nextEdit": {"engine": "completion"}}
    )
    assert not loop.edit_track()
    learning.on_shutdown()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A small real workspace: the standard library's `json` package."""
    root = tmp_path / "ws"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", root / "json")
    shutil.rmtree(root / "json" / "__pycache__", ignore_errors=True)
    (root / "arith.py").write_text(SOURCE, encoding="utf-8")
    return root


def options(cache: Path, model: Path, **training: Any) -> dict[str, Any]:
    return {
        "cacheDir": str(cache),
        "completion": {"model": str(model), "engine": "torch", "maxNewTokens": 4},
        "policy": {"showFloor": 1.0},
        "index": {"enabled": False},
        "telemetry": {"level": "off"},
        "training": {
            "minChangedFiles": 1,
            "idleS": 0,
            "maxLoad": 1000,
            "checkEveryS": 0.2,
            "checkpointEvery": 1,
            "evalCursors": 1,
            "maxMemoryMb": 0,
            **training,
        },
    }


async def start(workspace: Path, init: dict[str, Any]) -> LanguageClient:
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "lsp_server", "--stdio", env=dict(os.environ))
    await client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("vscode").capabilities,
            root_uri=workspace.as_uri(),
            initialization_options=init,
        )
    )
    return client


@pytest.fixture
async def clients() -> AsyncIterator[list[LanguageClient]]:
    """Clients the test starts; any still running at the end are shut down."""
    started: list[LanguageClient] = []
    yield started
    for client in started:
        server = client._server
        if server is not None and server.returncode is None:
            await client.shutdown_session()
        await client.stop()


async def status(client: LanguageClient) -> dict[str, Any]:
    result: dict[str, Any] = plain(await client.protocol.send_request_async("tabloop/status", {}))
    return result


async def until(
    client: LanguageClient, test: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """Poll `tabloop/status` until `test` holds (failing after WAIT_S, never hanging)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        current = await status(client)
        if test(current):
            return current
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S:.0f} s: {current}"
        await asyncio.sleep(0.1)


async def wait_for(test: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not test():
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S:.0f} s"
        await asyncio.sleep(0.1)


def process_state(pid: int) -> str:
    """The `State:` letter of /proc/PID/status (`T`: stopped), `-` once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        pass
    return "-"


def gone(pid: int) -> bool:
    return process_state(pid) in ("-", "Z")


def training_pid(current: dict[str, Any]) -> int | None:
    run = current["training"].get("run") or {}
    return run.get("pid")


async def test_training_pauses_while_completions_are_served_and_resumes(
    workspace: Path, tiny_model_path: Path, tmp_path: Path, clients: list[LanguageClient]
) -> None:
    cache = tmp_path / "cache"
    # The child stays stopped for 20 s after a request: long enough that a loaded machine
    # cannot let the pause run out before the test looks at it.
    init = options(cache, tiny_model_path, budget="10m", budgetSamples=100_000, pauseAfterMs=20_000)
    client = await start(workspace, init)
    clients.append(client)
    await until(client, lambda s: s["model"]["state"] == "ready", "model")
    running = await until(client, lambda s: s["training"].get("run", {}).get("step"), "step")
    pid = training_pid(running)
    assert pid is not None and running["training"]["state"] == "training"
    child = psutil.Process(pid)
    assert child.nice() == 19  # the lowest priority
    assert "train" in child.cmdline() and "--promote" in child.cmdline()
    assert child.environ()["OMP_NUM_THREADS"] == "1"
    assert process_state(pid) != "T"

    uri = (workspace / "arith.py").as_uri()
    document = types.TextDocumentItem(uri=uri, language_id="python", version=1, text=SOURCE)
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=document))
    await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=1, character=8),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
    )
    # Answered: the child stays stopped for pauseAfterMs after the last request. (The signal is
    # sent at once; a nice-19 process on a busy machine may take a moment to be seen stopped.)
    await wait_for(lambda: process_state(pid) == "T", "stopped child")
    paused = await status(client)
    assert paused["training"]["state"] == "paused"
    assert paused["training"]["run"]["pauses"] == 1

    # Idle again: it is continued and trains on.
    await wait_for(lambda: process_state(pid) not in ("T", "t"), "continued child")
    await until(client, lambda s: s["training"]["state"] in ("training", "judging"), "resume")
    step = paused["training"]["run"]["step"]
    await until(client, lambda s: (s["training"].get("run") or {}).get("step", 0) > step, "step")

    # A next edit wants the model too: an edit, then the request at it stops the child again.
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(0, 8), types.Position(0, 9)), text="x"
                )
            ],
        )
    )
    position = {"line": 0, "character": 9}
    params = {"textDocument": {"uri": uri, "version": 2}, "position": position}
    await client.protocol.send_request_async(TABLOOP_NEXT_EDIT_REQUEST, params)
    await wait_for(lambda: process_state(pid) == "T", "stopped child")
    timings = plain(await client.protocol.send_request_async(NEXT_EDIT_TIMINGS_REQUEST, {}))
    assert timings[-1]["reached_model"] is True
    again = await status(client)
    assert again["training"]["state"] == "paused" and again["training"]["run"]["pauses"] == 2
    await wait_for(lambda: process_state(pid) not in ("T", "t"), "continued child")

    # Shut down while it runs: the child is stopped, not left behind, and its run is unfinished.
    await client.shutdown_session()
    await wait_for(lambda: gone(pid), "child stopped at shutdown")
    state_dir = scope_dir(cache, workspace=workspace) / STATE_DIR
    record = json.loads((state_dir / STATE_FILE).read_text())
    assert record["outcome"] == INTERRUPTED and record["pid"] is None
    assert (scope_dir(cache, workspace=workspace) / RUN_DIR / CHECKPOINTS).is_dir()
    tokens = [
        reports for reports in client.progress_reports.values()
        if any(getattr(r, "title", None) == TRAINING_PROGRESS_TITLE for r in reports)
    ]  # fmt: skip
    assert tokens, "no $/progress for the training run"
    messages = [getattr(r, "message", None) or "" for r in tokens[0]]
    assert any(m.startswith("step ") for m in messages), messages
    assert isinstance(tokens[0][-1], types.WorkDoneProgressEnd)


async def test_a_killed_training_resumes_after_a_server_restart(
    workspace: Path, tiny_model_path: Path, tmp_path: Path, clients: list[LanguageClient]
) -> None:
    cache = tmp_path / "cache"
    init = options(cache, tiny_model_path, budgetSamples=48)
    first = await start(workspace, init)
    clients.append(first)
    await until(first, lambda s: s["model"]["state"] == "ready", "model")
    running = await until(first, lambda s: training_pid(s) is not None, "training run")
    pid = training_pid(running)
    assert pid is not None
    checkpoints = scope_dir(cache, workspace=workspace) / RUN_DIR / CHECKPOINTS
    await wait_for(lambda: any(checkpoints.glob("step-*")), "a checkpoint")
    os.killpg(pid, signal.SIGSTOP)  # mid-run, however fast this machine trains

    # The server dies (no shutdown), then its training process is killed mid-run.
    server = first._server
    assert server is not None
    server.kill()
    await server.wait()
    assert not gone(pid)  # the run outlived its server
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: gone(pid), "killed child")
    await first.stop()
    clients.remove(first)

    second = await start(workspace, init)
    clients.append(second)
    done = await until(
        second,
        lambda s: s["training"]["lastRun"]["outcome"] not in (None, INTERRUPTED),
        "finished run",
    )
    last = done["training"]["lastRun"]
    assert last["resumedFromStep"] >= 1, last  # from the checkpoint the killed run left
    assert last["steps"] == 6  # 48 samples, 8 a step: the same run, finished
    assert last["version"] == "v0001"
    assert done["training"]["state"] == "waiting"
    assert not checkpoints.exists()  # finished: the next run starts fresh


async def test_a_run_over_the_memory_cap_is_stopped_and_not_retried_at_once(
    workspace: Path, tiny_model_path: Path, tmp_path: Path, clients: list[LanguageClient]
) -> None:
    cache = tmp_path / "cache"
    client = await start(workspace, options(cache, tiny_model_path, maxMemoryMb=1))
    clients.append(client)
    # (The run may be stopped before any status shows it running: it is over the cap at once.)
    stopped = await until(
        client, lambda s: s["training"]["lastRun"]["outcome"] == OVER_MEMORY, "memory stop"
    )
    assert stopped["training"]["state"] == "waiting"
    assert "run" not in stopped["training"]
    # Later looks do not start it again: it waits for new material or the minimum interval.
    later = await until(client, lambda s: s["training"]["reason"] != "", "a reason to wait")
    assert later["training"]["state"] == "waiting", later
    assert (
        "new material" in later["training"]["reason"] or "interval" in later["training"]["reason"]
    )
    assert later["training"]["lastRun"]["startedAt"] == stopped["training"]["lastRun"]["startedAt"]


async def test_the_next_edit_track_trains_on_the_workspaces_history_in_the_background(
    tiny_model_path: Path, tmp_path: Path, clients: list[LanguageClient]
) -> None:
    from tests.evaluation.test_eval_edits import NAMES, module

    root = tmp_path / "repo"
    make_repo(root, [{"m.py": module(k)} for k in range(len(NAMES) + 1)])
    cache = tmp_path / "cache"
    init = options(cache, tiny_model_path, budgetSamples=4, minChangedFiles=1000, minNewCommits=4)
    init["nextEdit"] = {"engine": "torch-bfloat16", "windowLines": 8}
    client = await start(root, init)
    clients.append(client)
    done = await until(
        client,
        lambda s: s["training"]["lastRun"]["outcome"] not in (None, INTERRUPTED),
        "finished run",
    )
    last = done["training"]["lastRun"]
    assert last["task"] == "next-edit", last
    assert last["outcome"] in ("promoted", "not promoted") and last["version"] == "v0001", last
    assert done["training"]["nextEditTrack"] is True
    # Its version is in the next-edit track's registry; the completion adapters have none.
    registry = edit_registry(cache, root)
    assert [v.name for v in registry.versions()] == ["v0001"]
    evaluation = registry.get(1).evaluation
    assert evaluation is not None and evaluation["task"] == "next-edit"
    assert evaluation["next_edits"]["n"] == 1  # `training.evalCursors`, of the judged commits
    assert not (scope_dir(cache, workspace=root) / "registry.json").exists()
    # Both tracks wait now: no new commits, no kept edits, too few changed files.
    waiting = await until(client, lambda s: "next edits:" in s["training"]["reason"], "reason")
    assert "completions: new material" in waiting["training"]["reason"], waiting
    assert "0 of 4 new commits" in waiting["training"]["reason"], waiting
