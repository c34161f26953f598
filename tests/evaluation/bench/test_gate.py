"""`tabloop bench gate`: the AUC it reports, and a run on real files with a scripted model."""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from evaluation.bench.gate import (
    auc,
    ceiling,
    cross_validated_scores,
    lost_chars_when_skipping,
    measure,
)
from evaluation.simulation import Position, sample_positions
from tests.support.scripted_model import ScriptedModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_auc_orders_and_ties() -> None:
    positive = np.array([False, False, True, True])
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), positive) == 1.0
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), positive) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), positive) == 0.5
    # One positive below one negative: 3 of 4 pairs ordered right.
    assert auc(np.array([0.1, 0.6, 0.5, 0.9]), positive) == 0.75


def test_cross_validation_finds_a_real_signal_and_not_a_fake_one() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 3))
    y = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(float)
    assert auc(cross_validated_scores(x, y), y.astype(bool)) > 0.9
    noise = rng.normal(size=(400, 3))
    assert abs(auc(cross_validated_scores(noise, y), y.astype(bool)) - 0.5) < 0.1


def test_auc_is_undefined_for_one_class() -> None:
    assert np.isnan(auc(np.array([0.1, 0.2]), np.array([True, True])))


def test_ceiling_silences_the_lowest_scored_share_and_judges_the_goals() -> None:
    # 20 suggestions; the 5 lowest-scored are the 5 ignored ones: silencing 25% keeps every
    # accepted character and raises the accept rate by a third.
    score = np.arange(20, dtype=float)
    accepted = np.arange(20) >= 5
    chars = np.where(accepted, 10.0, 0.0)
    reach = ceiling(score, accepted, chars, chars, lam=1.0)
    quarter = reach["silence_25%"]
    assert quarter["shown_change_pct"] == -25.0
    assert quarter["accept_rate_change_pct"] == pytest.approx(33.33)
    assert quarter["accepted_chars_change_pct"] == 0.0
    assert quarter["reward_change"] == 5.0  # five ignored suggestions at -1 each, no longer shown
    assert quarter["goals_met"]
    # Silencing 20% keeps every accepted character too, but -20% shown misses the -21% goal.
    assert not reach["silence_20%"]["goals_met"]
    # At 30% accepted ones go too: 10 characters lost for 1 more saved.
    assert reach["silence_30%"]["reward_change"] == -5.0
    assert not reach["silence_30%"]["goals_met"]


def test_lost_chars_counts_the_lowest_scored_share() -> None:
    score = np.arange(10, dtype=float)
    chars = np.array([5.0, 0, 0, 0, 0, 0, 0, 0, 0, 5.0])
    assert lost_chars_when_skipping(score, chars) == {
        "skip_10%": 0.5,
        "skip_20%": 0.5,
        "skip_30%": 0.5,
    }
    assert lost_chars_when_skipping(score, np.zeros(10))["skip_10%"] is None


# A suggestion the simulated user ignores: no truth in these files starts with "# §". A comment,
# so that the syntax check in place (`completion.syntaxCheck`) keeps it: it ends the line and
# breaks no code.
WRONG = "# §§ not this"


def scripted_user_session(positions: list[Position]) -> tuple[ScriptedModel, int, int]:
    """A model that is right exactly at the positions at the start of a line's code.

    Where the hole has at least four non-blank characters, it answers it (at the start of the
    line's code) or `WRONG` (elsewhere, where no code follows on the line); at the other
    positions, nothing.
    Returns the model, the number of suggestions and the number of them that are right.
    """
    rules: dict[str, str] = {}
    right = 0
    keyed = []
    for position in positions:
        rest = position.hole.rstrip()
        if sum(not ch.isspace() for ch in rest) < 4:
            continue
        line_prefix = position.prefix[position.prefix.rfind("\n") + 1 :]
        at_line_start = not line_prefix.strip()
        if not at_line_start and position.suffix.split("\n", 1)[0].strip():
            continue  # a wrong comment here would comment out code: the syntax check drops it
        if at_line_start:
            # The prompt ends at the line break; the model writes the indentation itself.
            key = position.prefix[: len(position.prefix) - len(line_prefix)]
            keyed.append((key, line_prefix + rest))
        else:
            keyed.append((position.prefix, WRONG))
        right += at_line_start
    # The whole prefix is the key (the prompt budget holds whole files); when one prefix ends
    # with another, the longer comes first, so that each position gets its own answer.
    for key, answer in sorted(keyed, key=lambda item: -len(item[0])):
        rules[key] = answer
    return ScriptedModel(rules=rules), len(rules), right


def test_measure_on_real_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "fnmatch.py"):
        shutil.copy(STDLIB / name, corpus / name)
    args = argparse.Namespace(
        corpus=corpus,
        positions=40,
        seed=0,
        model="scripted",
        max_new_tokens=48,
        context_tokens=32768,  # every prompt holds the whole file before the cursor
        threads=1,
        cache=tmp_path / "gen.jsonl",
        # The same files as the held-out corpus: the scripted model answers the same positions.
        held_out=corpus,
        held_out_positions=40,
    )
    # The bench samples the same positions, and loads its model through `load_runner`.
    model, suggestions, right = scripted_user_session(sample_positions(corpus, 40, 0))
    monkeypatch.setattr("completion.runners.load_runner", lambda settings, cache_dir: model)
    report = measure(args)
    assert (report["positions"], report["suggestions"]) == (40, suggestions)
    assert report["accept_rate"] == round(right / suggestions, 4)
    # Acceptance is exactly "at the start of the line's code": that feature separates it.
    assert report["feature_auc"]["at_line_start"] == 1.0
    assert all(0.0 <= v <= 1.0 for v in report["feature_auc"].values())
    # Fitted models' AUCs depend on the optimiser's floating point, so only their range is
    # certain; with both outcomes present they are defined.
    for name in ("gate_cv_auc", "pre_model_cv_auc"):
        assert 0.0 <= report[name] <= 1.0
    lost = report["pre_model_accepted_chars_lost"]
    assert set(lost) == {"skip_10%", "skip_20%", "skip_30%"}
    assert all(0.0 <= share <= 1.0 for share in lost.values())
    # The baseline is measured on the same suggestions: a seeded random skip.
    baseline = report["baseline"]
    assert 0.0 <= baseline["auc"] <= 1.0
    assert set(baseline["accepted_chars_lost"]) == set(lost)
    # The reward trade per λ: a larger distraction cost never shows more.
    trades = report["reward_defaults"]
    assert list(trades) == ["1", "2", "3", "4", "6", "8", "12"]
    shown = [trades[k]["shown_change_pct"] for k in trades]
    assert all(-100.0 <= v <= 0.0 for v in shown)
    # The ceiling silences the lowest-scored shares of the same suggestions.
    reach = report["ceiling"]
    assert reach["lambda"] == 1.0
    assert [k for k in reach if k != "lambda"] == [
        "silence_20%",
        "silence_25%",
        "silence_30%",
        "silence_35%",
    ]
    assert all(-36.0 <= reach[k]["shown_change_pct"] <= -19.0 for k in reach if k != "lambda")
    held_out = report["held_out"]
    assert (held_out["positions"], held_out["suggestions"]) == (40, suggestions)
    # Fitted on every outcome of these very suggestions, the model separates them.
    assert held_out["gate_auc"] > 0.9
    assert set(held_out["ceiling"]) == set(reach)
    assert set(report["builtin_policy"]) == {
        "shown_change_pct",
        "accept_rate_change_pct",
        "accepted_chars_change_pct",
    }
    json.dumps(report, allow_nan=False)
    # A second run answers every prompt from the output cache, with the same figures.
    asked = len(model.prompts)
    assert measure(args) == report
    assert len(model.prompts) == asked == 40
