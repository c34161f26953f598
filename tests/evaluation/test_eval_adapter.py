"""`tabloop eval adapter`: an adapter judged on a directory's held-out files against the base
model or another adapter, over the tiny model."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from completion.runners.torch_runner import TorchRunner
from tabloop.cli import main
from tests.support.adapters import strong_adapter
from training.examples import split_files, workspace_files


@pytest.fixture
def corpus(tmp_path: Path, tiny_model_path: Path) -> Path:
    root = tmp_path / "corpus"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "email", root / "email")
    shutil.rmtree(root / "email" / "__pycache__", ignore_errors=True)
    (root / "tabloop.toml").write_text(
        f'[completion]\nmodel = "{tiny_model_path}"\nengine = "torch"\nmax_new_tokens = 4\n',
        encoding="utf-8",
    )
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    return found


def test_an_adapter_is_judged_on_the_held_out_files_against_the_base_or_another(
    corpus: Path, tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path / "cache", threads=1)
    adapter = strong_adapter(runner.source, runner.base_model_id, tmp_path, tmp_path / "a")
    runner.close()
    _, held_out = split_files(workspace_files(corpus))
    assert held_out  # the hash split leaves some of the package out

    against_base = run(
        capsys, "eval", "adapter", "--corpus", str(corpus), "--adapter", str(adapter),
        "--n", "6", "--json",
    )  # fmt: skip
    assert against_base["held_out_files"] == held_out
    configuration = against_base["configuration"]
    assert configuration["engine"] == "torch"
    assert configuration["loaded"]["threads"] >= 1
    assert configuration["baseline"] == "base model"
    assert configuration["model_id"].startswith("tiny-model-v1@")
    judged = against_base["judged"]
    assert judged["n"] == 6 and judged["exact_line_difference"]["n"] == 6
    # The strong adapter changes what the model writes: the two sides are not the same run.
    assert judged["serving"] != judged["candidate"]

    # Against itself, on the same cursors, every difference is nothing.
    itself = run(
        capsys, "eval", "adapter", "--corpus", str(corpus), "--adapter", str(adapter),
        "--baseline-adapter", str(adapter), "--n", "6", "--json",
    )  # fmt: skip
    assert itself["configuration"]["baseline"] == str(adapter)
    assert itself["judged"]["serving"] == itself["judged"]["candidate"] == judged["candidate"]
    assert itself["judged"]["edit_similarity_difference"]["mean"] == 0


def test_bad_arguments_are_clear_errors(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "adapter", "--corpus", str(corpus), "--adapter", str(tmp_path / "none")])
    with pytest.raises(SystemExit):
        main(["eval", "adapter", "--corpus", str(tmp_path / "none"), "--adapter", str(corpus)])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no held-out file"):
        main(["eval", "adapter", "--corpus", str(empty), "--adapter", str(corpus)])
