from __future__ import annotations

import random
from itertools import islice
from pathlib import Path

import pytest

from training.examples import (
    cut_examples,
    is_held_out,
    read_text,
    split_files,
    stream_code_examples,
    workspace_files,
)


def test_workspace_files_follow_the_index_rules(workspace: Path) -> None:
    files = workspace_files(workspace)
    assert "json/decoder.py" in files
    assert "generated.py" not in files  # .gitignore
    assert ".env" not in files  # denied by name
    assert all(f.endswith(".py") for f in files)


def test_a_file_holding_a_secret_is_not_read(workspace: Path) -> None:
    assert read_text(workspace, "settings.py") is None
    assert read_text(workspace, "json/decoder.py") is not None


def test_held_out_split_is_disjoint_and_stable() -> None:
    files = [f"pkg/module_{i}.py" for i in range(200)]
    train, held = split_files(files)
    assert set(train).isdisjoint(held) and set(train) | set(held) == set(files)
    assert 20 <= len(held) <= 60  # about 20%
    # Adding files never moves an existing one to the other side.
    train2, held2 = split_files([*files, "new.py", "other/new.py"])
    assert set(held) <= set(held2) and set(train) <= set(train2)
    assert all(is_held_out(f) for f in held)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cut_examples_put_the_file_back_together(workspace: Path, seed: int) -> None:
    text = (workspace / "json" / "decoder.py").read_text()
    examples = cut_examples("json/decoder.py", text, 40, random.Random(seed))
    assert len(examples) >= 30
    assert {e.kind for e in examples} == {"line", "call", "block"}
    for example in examples:
        assert example.prefix + example.middle + example.suffix == text
        assert example.middle.strip()
        if example.kind != "block":
            assert "\n" not in example.middle


def test_stream_is_a_pure_function_of_the_seed(workspace: Path) -> None:
    files, _ = split_files(workspace_files(workspace))
    first = list(islice(stream_code_examples(workspace, files, seed=3), 50))
    again = list(islice(stream_code_examples(workspace, files, seed=3), 50))
    other = list(islice(stream_code_examples(workspace, files, seed=4), 50))
    assert first == again
    assert first != other
    assert {e.path for e in first} <= set(files)


def test_stream_goes_on_over_epochs_and_ends_without_files(workspace: Path) -> None:
    files = ["json/tool.py"]
    many = list(islice(stream_code_examples(workspace, files, seed=0, per_file=2), 7))
    assert len(many) == 7
    assert list(stream_code_examples(workspace, ["missing.py"], seed=0)) == []
