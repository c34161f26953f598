"""`tabloop bench objectives` end to end on the tiny model: feedback played, each objective
trained on it, each judged against the base model on the same held-out cursors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import objectives


def test_each_objective_trains_on_the_same_feedback_and_is_judged_on_the_same_cursors(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--corpus", "json", "--model", str(tiny_model_path), "--engine", "torch",
        "--configs", "fim,feedback_kl", "--positions", "12", "--judge-positions", "8",
        "--samples", "4", "--effective-batch", "2", "--n", "4", "--context-tokens", "96",
        "--max-new-tokens", "6", "--threads", "1", "--cache-dir", str(tmp_path), "--json",
    ]  # fmt: skip
    assert objectives.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["command"].startswith("tabloop bench objectives --corpus json")
    assert report["held_out_files"] and report["settings"]["samples"] == 4
    # Every pause played is counted; each shown suggestion left one row with its outcome.
    played = report["played"]["training"]
    assert played["requests"] == 12
    assert sum(report["feedback"]["training"].values()) == played["shown"]
    assert sum(report["feedback"]["judging"].values()) == report["played"]["judging"]["shown"]
    fim, anchored = report["configs"]["fim"], report["configs"]["feedback_kl"]
    assert fim["training"]["code"] and not anchored["training"]["code"]
    assert fim["training"]["kl_weight"] == 0.0 and anchored["training"]["kl_weight"] == 0.1
    for config in (fim, anchored):
        assert config["training"]["samples"] == 4
        files = config["judgement"]["files"]
        assert files["n"] == 4
        difference = files["exact_line_difference"]
        assert difference["ci95_low"] <= difference["mean"] <= difference["ci95_high"]
    # The base model's side is the same for both: the same cursors, the same weights.
    assert fim["judgement"]["files"]["serving"] == anchored["judgement"]["files"]["serving"]


def test_an_unknown_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown configs"):
        objectives.main(["--configs", "fim,dpo", "--cache-dir", str(tmp_path), "--json"])
