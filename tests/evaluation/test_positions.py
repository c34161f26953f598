"""One position sampler: each caller samples exactly the positions it sampled before there was one.

Committed results and cached model outputs are keyed on the sampled positions, so the sampler's
draw order is a contract. The fingerprints below were recorded from the three samplers as they
were written before `evaluation/positions.py` existed (the demo's `find_holes`, `eval holes`'
`sample_holes` and the replay's `sample_positions`), on CPython 3.11.7's standard library; they
are checked where the same files are installed and skipped elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import random
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from evaluation import demo, holes, simulation
from evaluation.positions import (
    Draw,
    FunctionStatements,
    read_sources,
    sample_cursors,
    select_files,
)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SAMPLED_DIRS = ("email", "asyncio")
# What the fingerprints were recorded on: the sampled files' contents, and the listing of `test/`.
SAMPLED_CORPUS = "ca7821c880eeadea"
LISTED_CORPUS = "fcf371c29dfd6ae1"

EXPECTED = {
    "holes/email/0": "a17a9e616c72a8eb",
    "simulation/email/0": "2608429202fd4682",
    "holes/asyncio/0": "ccabdb60cb429196",
    "simulation/asyncio/0": "32de18218e306483",
    "demo/3x2/0": "bf9222f0b2814511",
    "demo/5x4/0": "253c786e07cebb0c",
    "holes/email/7": "c9ee5d3918e35770",
    "simulation/email/7": "4284706fa2f2d032",
    "holes/asyncio/7": "1b1f8f8b2474e7b6",
    "simulation/asyncio/7": "aaea4f0007e8fdc6",
    "demo/3x2/7": "37dbd85ebc1d4cf1",
    "demo/5x4/7": "4b749ce81e4e91e5",
    "holes/email/12345": "a32e548ef4734449",
    "simulation/email/12345": "25cfb2d01faee808",
    "holes/asyncio/12345": "93c2e2393572c2c9",
    "simulation/asyncio/12345": "3548d4675d8fe509",
    "demo/3x2/12345": "1b744bd2de9200ec",
    "demo/5x4/12345": "33e71675476427fd",
}
SEEDS = (0, 7, 12345)


def _digest(rows: Any) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _rel(path: str | Path) -> str:
    return Path(path).relative_to(STDLIB).as_posix()


def _demo_paths() -> list[Path]:
    return [STDLIB / name for name in demo.DEMO_MODULES]


@pytest.fixture(scope="module")
def sampled_corpus() -> None:
    paths = sorted(p for d in SAMPLED_DIRS for p in (STDLIB / d).rglob("*.py")) + _demo_paths()
    digest = hashlib.sha256()
    for path in paths:
        digest.update(_rel(path).encode())
        digest.update(path.read_bytes())
    if digest.hexdigest()[:16] != SAMPLED_CORPUS:
        pytest.skip("the fingerprints were recorded on CPython 3.11.7's standard library")


@pytest.mark.usefixtures("sampled_corpus")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("corpus", SAMPLED_DIRS)
def test_eval_holes_samples_the_recorded_holes(corpus: str, seed: int) -> None:
    sampled = holes.sample_holes(holes.corpus_files(STDLIB / corpus), 150, random.Random(seed))
    rows = [
        (_rel(h.path), h.kind, h.line, h.character, len(h.prefix),
         _sha(h.prefix + "\0" + h.truth + "\0" + h.suffix))
        for h in sampled
    ]  # fmt: skip
    assert _digest(rows) == EXPECTED[f"holes/{corpus}/{seed}"]


@pytest.mark.usefixtures("sampled_corpus")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("corpus", SAMPLED_DIRS)
def test_replay_samples_the_recorded_positions(corpus: str, seed: int) -> None:
    sampled = simulation.sample_positions(STDLIB / corpus, 150, seed)
    rows = [
        (_rel(p.path), p.line, p.character, len(p.prefix), p.language,
         _sha(p.prefix + "\0" + p.truth))
        for p in sampled
    ]  # fmt: skip
    assert _digest(rows) == EXPECTED[f"simulation/{corpus}/{seed}"]


@pytest.mark.usefixtures("sampled_corpus")
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("files", "per_file"), [pytest.param(3, 2, id="default"), (5, 4)])
def test_demo_samples_the_recorded_holes(files: int, per_file: int, seed: int) -> None:
    sampled = demo.find_holes(_demo_paths()[:files], per_file, random.Random(seed))
    rows = [(_rel(h.path), h.line, h.column, h.typed, h.truth) for h in sampled]
    assert len(sampled) == files * per_file
    assert _digest(rows) == EXPECTED[f"demo/{files}x{per_file}/{seed}"]


def test_file_selection_keeps_each_callers_limits() -> None:
    """`eval holes` takes files up to 300 kB, the replay up to 200 kB and no test files."""
    root = STDLIB / "test"
    listed = sorted(p for p in root.rglob("*") if p.is_file())
    if _digest([(_rel(p), p.stat().st_size) for p in listed]) != LISTED_CORPUS:
        pytest.skip("the fingerprints were recorded on CPython 3.11.7's standard library")
    holes_files = [_rel(p) for p in holes.corpus_files(root)]
    replay_files = [_rel(p) for p in simulation.corpus_files(root)]
    assert (len(holes_files), _digest(holes_files)) == (821, "49f2d4fb68bd79e3")
    assert (len(replay_files), _digest(replay_files)) == (222, "944edd2d95eb03a9")


def test_select_files_limits(tmp_path: Path) -> None:
    for name, size in [("a.py", 10), ("big.py", 101), ("test_a.py", 10), ("b.txt", 10)]:
        (tmp_path / name).write_text("x" * size)
    assert [p.name for p in select_files(tmp_path, {".py"}, 100)] == ["a.py", "test_a.py"]
    assert [p.name for p in select_files(tmp_path, {".py"}, 101, skip_tests=True)] == [
        "a.py",
        "big.py",
    ]


def test_per_file_draw_takes_count_from_each_file() -> None:
    sources = read_sources(_demo_paths()[:2])
    cursors = sample_cursors(sources, 3, random.Random(1), FunctionStatements(), Draw.PER_FILE)
    assert [c.source.path.name for c in cursors] == ["textwrap.py"] * 3 + ["shlex.py"] * 3
    for cursor in cursors:
        assert cursor.source.text[cursor.offset :].startswith(cursor.line.text[cursor.column :])
