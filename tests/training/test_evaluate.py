from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from completion.adapters import read_manifest
from completion.runners.merge import adapter_key, merged_path
from completion.runners.onnx import OnnxRunner
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from tests.support.adapters import strong_adapter
from tests.support.scripted_model import ScriptedModel
from training.edit_examples import EditExample
from training.edit_store import EditExampleStore
from training.evaluate import (
    HeldOutOutcomes,
    compare,
    edit_similarity,
    held_out_cursors,
    held_out_edits,
    held_out_outcomes,
    judging_cost,
    judging_runner,
    paired,
)
from training.examples import FimExample, split_files, workspace_files
from training.feedback import Feedback, FeedbackStore
from training.registry import promotion_decision


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


EDITS = (
    EditExample("a.py", "<|file_sep|>updated/a.py\n", "x = 1\n", "x = 2\n", "live"),
    EditExample("b.py", "<|file_sep|>updated/b.py\n", "y = 1\n", "y = 1\n", "live"),
    EditExample("c.py", "<|file_sep|>updated/c.py\n", "z = 1\n", "z = 3\n", "live"),
)


@dataclass
class ScriptedVersions(ScriptedModel):
    """A scripted model whose rules are those of the adapter it serves (None: the base)."""

    versions: dict[Path | None, dict[str, str]] = field(default_factory=dict)
    adapter: Path | None = None

    def swap_adapter(self, adapter: Path | None) -> None:
        self.adapter, self.rules = adapter, self.versions[adapter]


def test_next_edits_are_judged_on_the_window_each_version_would_show(tmp_path: Path) -> None:
    candidate = tmp_path / "candidate"
    base = {
        "updated/a.py\n": "x = 1\n<|file_sep|>",  # no change where one was due
        "updated/b.py\n": "y = 1\n<|file_sep|>",  # rightly none
        "updated/c.py\n": "z = 3\n<|file_sep|>",  # the edit
    }
    trained = {
        "updated/a.py\n": "x = 2\n<|file_sep|>",  # the edit
        "updated/b.py\n": "y = 1\n" * 40,  # cut at the token limit: the window shown as it is
        "updated/c.py\n": "<|file_sep|>",  # empty: nothing shown, so no edit
    }
    runner = ScriptedVersions(versions={None: base, candidate: trained})
    runner.swap_adapter(None)
    settings = CompletionSettings(model="scripted")
    report = compare(runner, settings, None, candidate, [], HeldOutOutcomes(edits=EDITS))
    edits = report["next_edits"]
    assert edits["n"] == 3 and edits["edits_due"] == 2
    assert edits["serving"]["exact_window_match"] == round(2 / 3, 4)
    assert edits["candidate"]["exact_window_match"] == round(2 / 3, 4)
    assert edits["exact_window_difference"]["mean"] == 0.0
    assert edits["exact_window_difference"]["n"] == 3
    assert runner.adapter is None
    # Each rewrite was asked with the example's own prompt, once per version.
    assert runner.prompts == [e.prompt for e in EDITS] * 2


def _outcomes(cursors: list[FimExample]) -> HeldOutOutcomes:
    kept = tuple(cursors[:2])
    ignored = tuple(replace(c, middle="print(1)") for c in cursors[2:])
    return HeldOutOutcomes(kept, ignored, EDITS)


def test_compare_runs_both_on_the_same_cursors_and_restores_the_runner(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    _train, held = split_files(workspace_files(workspace))
    cursors = held_out_cursors(workspace, held or ["json/tool.py"], 4, seed=0)
    assert len(cursors) == 4
    assert cursors == held_out_cursors(workspace, held or ["json/tool.py"], 4, seed=0)
    runner = TorchRunner(str(tiny_model_path), tmp_path, threads=1)
    adapter = strong_adapter(runner.source, runner.base_model_id, tmp_path, tmp_path / "a")
    settings = CompletionSettings(model=str(tiny_model_path), max_new_tokens=4)
    report = compare(runner, settings, None, adapter, cursors, _outcomes(cursors))
    assert report["n"] == 4 and report["engine"] == "torch"
    assert set(report["serving"]) == {"exact_line_match", "edit_similarity"}
    assert report["edit_similarity_difference"]["n"] == 4
    assert report["kept_text"]["n"] == 2 and report["kept_text"]["exact_line_difference"]["n"] == 2
    assert report["ignored_reproduced"]["n"] == 2
    assert report["ignored_reproduced"]["difference"]["n"] == 2
    assert report["next_edits"]["n"] == 3 and report["next_edits"]["edits_due"] == 2
    assert set(report["seconds"]) == {"serving", "candidate"}
    assert all(
        set(times) == {"ready_s", "completing_s"} and min(times.values()) >= 0
        for times in report["seconds"].values()
    )
    assert runner.adapter is None
    runner.close()


def test_the_judgement_runs_on_the_fast_engine_and_keeps_the_candidates_conversion(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    """With the default engine the judge is ONNX Runtime GenAI: both versions complete there,
    the candidate merged and converted once and kept for when it is promoted and served; the
    report is the one the promotion rule reads."""
    _train, held = split_files(workspace_files(workspace))
    cursors = held_out_cursors(workspace, held or ["json/tool.py"], 4, seed=0)
    settings = CompletionSettings(model=str(tiny_model_path), max_new_tokens=4, threads=1)
    runner = judging_runner(settings, tmp_path / "cache")
    try:
        assert isinstance(runner, OnnxRunner)
        adapter = strong_adapter(runner.source, runner.base_model_id, tmp_path, tmp_path / "a")
        report = compare(runner, settings, None, adapter, cursors, _outcomes(cursors))
        assert runner.adapter is None  # serving the base again
        key = adapter_key(read_manifest(adapter))
        merged = merged_path(
            runner.source, key, runner.compute_type, tmp_path / "cache", engine="onnxruntime"
        )
        assert merged.is_dir()  # converted once, kept for serving
        assert runner.prepare_adapter(adapter).path.is_relative_to(merged)
    finally:
        runner.close()
    assert report["engine"] == "onnxruntime"
    assert report["edit_similarity_difference"]["n"] == 4
    assert report["kept_text"]["n"] == 2 and report["ignored_reproduced"]["n"] == 2
    assert report["next_edits"]["exact_window_difference"]["n"] == 3  # rewritten with drafts
    allowed, reason = promotion_decision(report, 0.0)
    assert isinstance(allowed, bool) and reason
    cost = judging_cost(report["engine"], 12.0, {"elapsed_s": 48.0})
    assert cost == {
        "engine": "onnxruntime",
        "seconds": 12.0,
        "training_s": 48.0,
        "share_of_training": 0.25,
    }


def test_the_torch_engine_judges_on_torch(tiny_model_path: Path, tmp_path: Path) -> None:
    settings = CompletionSettings(model=str(tiny_model_path), engine="torch", threads=1)
    runner = judging_runner(settings, tmp_path)
    assert isinstance(runner, TorchRunner)
    runner.close()


def test_held_out_outcomes_are_those_the_version_never_trained_on(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    outcomes = ["accepted", "accepted", "ignored", "accepted", "dismissed", "accepted"]
    outcomes += ["partial", "ignored", "accepted"]
    for i, outcome in enumerate(outcomes):
        kept = {"accepted": f"f({i}) + 1", "partial": "f("}.get(outcome)
        store.record(Feedback(f"m{i}.py", "x = ", f"f({i})", "", outcome, 1.0, 0.5, kept=kept))
    # A row from before rows kept their text: the accepted suggestion stands for itself.
    store.record(Feedback("m9.py", "x = ", "g()", "", "accepted", 1.0, 0.5))
    keys = sorted(key for key, _ in store.keys(store.last_id()))
    train = {"window": {"trained_through": list(keys[3])}}  # trained up to the 4th row
    held = held_out_outcomes(store, train, limit=5)
    # After the mark, oldest first: the kept text (not the suggestion) and the ignored ones.
    assert [e.middle for e in held.kept] == ["f(5) + 1", "f(", "f(8) + 1", "g()"]
    assert [e.middle for e in held.ignored] == ["f(4)", "f(7)"]
    assert [e.middle for e in held_out_outcomes(store, train, limit=1).kept] == ["g()"]
    assert held_out_outcomes(store, train, limit=1).ignored[0].middle == "f(7)"
    # A version trained on no feedback saw none; one from before windows were kept: unknown.
    everything = held_out_outcomes(store, {"window": {"trained_through": None}}, limit=10)
    assert len(everything.kept) == 7 and len(everything.ignored) == 3
    assert not held_out_outcomes(store, {}, limit=10)


def test_held_out_edits_are_those_neither_version_trained_on(tmp_path: Path) -> None:
    store = EditExampleStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    for n in range(1, 11):
        store.record(EditExample(f"f{n}.py", "p", f"x = {n}\n", f"x = {n + 1}\n", "live"))
    # The candidate could read 1-10 and held out 8-10; the serving version trained through 8.
    train = {"edit_examples": {"held_out": 3, "upto_id": 10, "trained_through_id": 7}}
    serving = {"edit_examples": {"held_out": 1, "upto_id": 9, "trained_through_id": 8}}
    assert [e.path for e in held_out_edits(store, train, serving, 5)] == ["f10.py", "f9.py"]
    assert [e.path for e in held_out_edits(store, train, None, 5)] == ["f10.py", "f9.py", "f8.py"]
    assert [e.path for e in held_out_edits(store, train, None, 1)] == ["f10.py"]
    # A serving version from before examples were held out may have read any of them.
    assert held_out_edits(store, train, {"edit_examples": {"stored": 9}}, 5) == ()
    # A serving version trained on no next edits saw none.
    assert len(held_out_edits(store, train, {"edit_examples": None}, 5)) == 3
    # A candidate that held none out is not judged on next edits.
    assert held_out_edits(store, {"edit_examples": {"held_out": 0}}, None, 5) == ()
    assert held_out_edits(None, train, None, 5) == ()
    store.close()
