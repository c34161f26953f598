"""`tabloop bench gate`: the AUC it reports, and a run on real files with the tiny model."""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from bench.gate import auc, cross_validated_scores, lost_chars_when_skipping, measure

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


def test_lost_chars_counts_the_lowest_scored_share() -> None:
    score = np.arange(10, dtype=float)
    chars = np.array([5.0, 0, 0, 0, 0, 0, 0, 0, 0, 5.0])
    assert lost_chars_when_skipping(score, chars) == {
        "skip_10%": 0.5,
        "skip_20%": 0.5,
        "skip_30%": 0.5,
    }
    assert lost_chars_when_skipping(score, np.zeros(10))["skip_10%"] is None


@pytest.mark.usefixtures("tiny_model_path")
def test_measure_on_real_files(tmp_path: Path, tiny_model_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "fnmatch.py"):
        shutil.copy(STDLIB / name, corpus / name)
    args = argparse.Namespace(
        corpus=corpus,
        positions=40,
        seed=0,
        model=str(tiny_model_path),
        max_new_tokens=6,
        context_tokens=128,
        threads=1,
        cache=tmp_path / "gen.jsonl",
    )
    report = measure(args)
    assert report["positions"] == 40
    assert 0 < report["suggestions"] <= 40
    assert set(report["pre_model_accepted_chars_lost"]) == {"skip_10%", "skip_20%", "skip_30%"}
    # Valid JSON even when the tiny model's suggestions are all ignored (AUC undefined).
    json.dumps(report, allow_nan=False)
    figures = [*report["feature_auc"].values(), report["gate_cv_auc"], report["pre_model_cv_auc"]]
    assert all(v is None or 0.0 <= v <= 1.0 for v in figures)
    # A second run answers every prompt from the output cache, with the same figures.
    assert measure(args) == report
