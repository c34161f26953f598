from __future__ import annotations

from pathlib import Path

import pytest

from completion.adapters import save_adapter
from completion.runners.loading import load_model
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from training.evaluate import (
    accepted_examples,
    compare,
    edit_similarity,
    held_out_cursors,
    paired,
)
from training.examples import split_files, workspace_files
from training.feedback import Feedback, FeedbackStore
from training.lora import LoraShape, attach_lora


@pytest.mark.parametrize(
    ("a", "b", "similarity"),
    [
        pytest.param("", "", 1.0, id="empty"),
        pytest.param("abc", "abc", 1.0, id="same"),
        pytest.param("abcd", "abXd", 0.75, id="one-substitution"),
        pytest.param("", "abcd", 0.0, id="nothing"),
    ],
)
def test_edit_similarity(a: str, b: str, similarity: float) -> None:
    assert edit_similarity(a, b) == similarity


def test_paired_interval() -> None:
    result = paired([1.0, 0.0, 1.0, 0.0])
    assert result["mean"] == 0.5 and result["ci95_low"] < 0.5 < result["ci95_high"]
    assert paired([0.2, 0.2])["ci95_low"] == 0.2


def test_compare_runs_both_on_the_same_cursors_and_restores_the_runner(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    _train, held = split_files(workspace_files(workspace))
    cursors = held_out_cursors(workspace, held or ["json/tool.py"], 4, seed=0)
    assert len(cursors) == 4
    assert cursors == held_out_cursors(workspace, held or ["json/tool.py"], 4, seed=0)
    runner = TorchRunner(str(tiny_model_path), tmp_path, threads=1)
    _tokenizer, model = load_model(runner.source, "float32", tmp_path)
    save_adapter(
        attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", runner.base_model_id, {}
    )
    settings = CompletionSettings(model=str(tiny_model_path), max_new_tokens=4)
    report = compare(runner, settings, None, tmp_path / "a", cursors, accepted=cursors[:2])
    assert report["n"] == 4
    assert set(report["serving"]) == {"exact_line_match", "edit_similarity"}
    assert report["edit_similarity_difference"]["n"] == 4
    assert set(report["replay_accepted_first_line"]) == {"serving", "candidate"}
    assert runner.adapter is None
    runner.close()


def test_replayed_accepted_suggestions_are_those_the_version_never_trained_on(
    tmp_path: Path,
) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    for i in range(8):
        outcome = "ignored" if i == 6 else "accepted"
        store.record(Feedback(f"m{i}.py", "x = ", f"f({i})", "", outcome, 1.0, 0.5))
    keys = sorted(key for key, _ in store.keys(store.last_id()))
    train = {"window": {"trained_through": list(keys[4])}}  # trained up to the 5th row
    replayed = accepted_examples(store, train, limit=5)
    assert [e.middle for e in replayed] == ["f(5)", "f(7)"]  # after the mark, oldest first
    assert [e.middle for e in accepted_examples(store, train, limit=1)] == ["f(7)"]
    # A version trained on no feedback saw none; one from before windows were kept: unknown.
    assert len(accepted_examples(store, {"window": {"trained_through": None}}, limit=10)) == 7
    assert accepted_examples(store, {}, limit=10) == []
