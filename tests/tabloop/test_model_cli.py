"""`tabloop model list|promote|rollback|evaluate` over a workspace's adapter registry."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from completion.adapters import save_adapter
from completion.runners.loading import load_model, resolve_source
from tabloop.cli import main
from tests.support.adapters import strong_adapter
from training.feedback import FEEDBACK_FILE, Feedback, FeedbackStore
from training.lora import LoraShape, attach_lora
from training.registry import DEFAULT_MARGIN, AdapterRegistry, promotion_decision, scope_dir


def test_list_promote_rollback(
    tmp_path: Path,
    tiny_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache, workspace = tmp_path / "cache", tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    source = resolve_source(str(tiny_model_path), cache)
    _tokenizer, model = load_model(source, "float32", cache)
    base_id = f"{source.name}@{source.revision}"
    save_adapter(attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", base_id, {})
    registry = AdapterRegistry(scope_dir(cache, workspace=workspace))
    registry.add(tmp_path / "a", base_id, {})
    registry.add(tmp_path / "a", base_id, {})

    ws = ["--workspace", str(workspace)]
    assert main(["model", "promote", "v0001", *ws]) == 1
    assert "not been evaluated" in capsys.readouterr().err
    assert main(["model", "promote", "1", "--force", "--canary-share", "0", *ws]) == 0
    assert "v0001 serves (forced)" in capsys.readouterr().out
    assert main(["model", "list", "--json", *ws]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["serving"] == 1 and listed["versions"][0]["status"] == "serving"
    # A promotion is a canary first (half of the sessions); a rollback then rolls it back.
    assert main(["model", "promote", "2", "--force", *ws]) == 0
    assert "v0002 is a canary (forced; canary at 50% of clients)" in capsys.readouterr().out
    assert main(["model", "list", "--json", *ws]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["serving"] == 1 and listed["canary"]["version"] == 2
    assert [t["action"] for t in listed["transitions"]] == ["promote", "canary"]
    assert main(["model", "rollback", *ws]) == 0
    assert "now serving: v0001" in capsys.readouterr().out
    assert registry.canary() is None and registry.get(2).status == "rolled-back"
    assert main(["model", "approve", "2", *ws]) == 1
    assert "not waiting for approval" in capsys.readouterr().err
    assert main(["model", "rollback", *ws]) == 0
    assert "now serving: base model" in capsys.readouterr().out
    assert main(["model", "rollback", *ws]) == 1
    assert "nothing to roll back" in capsys.readouterr().err


def test_train_policy_and_plain_train_are_the_same_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["train", "--help"], ["train", "policy", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "usage: tabloop train [" in capsys.readouterr().out  # the policy trainer
    with pytest.raises(SystemExit):
        main(["train", "model", "--help"])
    assert "--budget" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        pytest.param("--replay-share", "1", id="replay-everything"),
        pytest.param("--held-out-share", "-0.1", id="negative-held-out"),
    ],
)
def test_window_shares_are_checked_before_anything_loads(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "model", flag, value])
    assert exit_info.value.code == 2
    assert flag.lstrip("-").replace("-", "_") in capsys.readouterr().err


def test_evaluate_judges_on_the_fast_engine_and_the_promotion_rule_reads_it(
    tmp_path: Path,
    tiny_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tabloop model evaluate` with the default engine: ONNX Runtime GenAI judges on the held-out
    files and the workspace's held-out outcomes, the report names the engine and the cost, and
    `tabloop model promote` decides from it."""
    cache, workspace = tmp_path / "cache", tmp_path / "ws"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", workspace / "json")
    shutil.rmtree(workspace / "json" / "__pycache__", ignore_errors=True)
    for name, value in {
        "TABLOOP_CACHE_DIR": str(cache),
        "TABLOOP_COMPLETION__MODEL": str(tiny_model_path),
        "TABLOOP_COMPLETION__MAX_NEW_TOKENS": "4",
        "TABLOOP_COMPLETION__THREADS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    source = resolve_source(str(tiny_model_path), cache)
    base_id = f"{source.name}@{source.revision}"
    strong_adapter(source, base_id, cache, tmp_path / "a")
    registry = AdapterRegistry(scope_dir(cache, workspace=workspace))
    registry.add(tmp_path / "a", base_id, {"window": {"trained_through": None}, "elapsed_s": 60})
    store = FeedbackStore(cache / FEEDBACK_FILE, workspace=workspace)
    prefix = "import json\n\ndef load(path):\n    with open(path) as f:\n        return "
    store.record(Feedback("a.py", prefix, "json.load(f)", "\n", "accepted", 1.0, 0.5, kept="x"))
    store.record(Feedback("a.py", prefix, "f.read()", "\n", "ignored", -0.25, 0.5))
    store.close()

    ws = ["--workspace", str(workspace)]
    assert main(["model", "evaluate", "1", "--n", "3", "--json", *ws]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "onnxruntime" and report["judging"]["engine"] == "onnxruntime"
    assert report["judging"]["training_s"] == 60 and report["judging"]["share_of_training"] > 0
    assert report["n"] == 3 and report["edit_similarity_difference"]["n"] == 3
    assert report["kept_text"]["n"] == 1 and report["ignored_reproduced"]["n"] == 1
    # The registry keeps what was printed, less the command that printed it.
    assert report.pop("command") == "tabloop model evaluate 1 --n 3 --json " + " ".join(ws)
    assert registry.get(1).evaluation == report
    allowed, reason = promotion_decision(report, DEFAULT_MARGIN)
    assert main(["model", "promote", "1", "--canary-share", "0", *ws]) == (0 if allowed else 1)
    printed = capsys.readouterr()
    assert reason in (printed.out if allowed else printed.err)
