"""`tabloop eval holes`: scoring, hole sampling, and a whole run with the tiny model."""

from __future__ import annotations

import argparse
import random
import shutil
import sysconfig
from pathlib import Path

import pytest

from lsp_server.evaluation import edit_similarity, levenshtein, run_holes, sample_holes
from tests.support.fixtures import tiny_embedder_path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ("colorsys.py", "bisect.py", "fnmatch.py")


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        pytest.param("", "", 0, id="empty"),
        pytest.param("abc", "abc", 0, id="equal"),
        pytest.param("kitten", "sitting", 3, id="classic"),
        pytest.param("", "abc", 3, id="insertions"),
        pytest.param("return x", "return y", 1, id="substitution"),
    ],
)
def test_levenshtein(a: str, b: str, distance: int) -> None:
    assert levenshtein(a, b) == distance == levenshtein(b, a)


def test_edit_similarity_bounds() -> None:
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("abc", "xyz") == 0.0
    assert 0 < edit_similarity("return x + 1", "return x + 2") < 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for name in CORPUS_FILES:
        shutil.copy(STDLIB / name, root / name)
    return root


def test_holes_put_back_give_the_file(corpus: Path) -> None:
    files = sorted(corpus.glob("*.py"))
    holes = sample_holes(files, 60, random.Random(3))
    assert len(holes) == 60
    assert {h.kind for h in holes} == {"line", "block"}
    for hole in holes:
        assert hole.prefix + hole.truth + hole.suffix == hole.path.read_text(encoding="utf-8")
        assert hole.truth.strip()
    assert sample_holes(files, 60, random.Random(3)) == holes  # reproducible


def test_a_run_with_and_without_retrieval(
    corpus: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    embedder = tiny_embedder_path()
    # The workspace file is one of tabloop's configuration layers; the run reads it.
    (corpus / "tabloop.toml").write_text(
        f'cache_dir = "{tmp_path / "cache"}"\n'
        f'[completion]\nmodel = "{tiny_model_path}"\n'
        f'[index]\nembedding_model = "{embedder}"\n',
        encoding="utf-8",
    )
    args = argparse.Namespace(
        corpus=str(corpus), n=6, seed=1, model=None, max_new_tokens=12, no_retrieval=False
    )
    first = run_holes(args)
    for run in ("without_retrieval", "with_retrieval"):
        result = first[run]
        assert result["n"] == 6
        assert 0.0 <= result["exact_line_match"] <= 1.0
        assert 0.0 <= result["edit_similarity"] <= 1.0
        assert result["parses"] is not None and result["latency_ms_p50"] is not None
    assert first["model_runs"] > 0
    # A rerun answers every prompt from the output cache and scores the same.
    second = run_holes(args)
    assert second["model_runs"] == 0
    for run in ("without_retrieval", "with_retrieval"):
        # Latency keeps the model's time from the first run, plus this run's context time.
        first[run].pop("latency_ms_p50")
        second[run].pop("latency_ms_p50")
        assert second[run] == first[run]
