"""The evaluations' output cache: a prompt is run once per model, settings and way of reading it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from completion.adapters import MANIFEST
from completion.output_cache import CachedRunner
from completion.types import CancelToken
from tests.support.scripted_model import ScriptedModel

PROMPT = "<|fim_prefix|>def area(r):\n    return <|fim_suffix|>\n<|fim_middle|>"


def never(_text: str) -> int | None:
    return None


class SplittingModel(ScriptedModel):
    """A model whose runner reads prompts in two parts (the fast engine with prompt reuse)."""

    output_variant = "static-prompt grid 64"


def ask(runner: CachedRunner) -> str:
    return runner.generate(PROMPT, max_new_tokens=32, stop=never, cancel=CancelToken()).text


def test_outputs_are_kept_on_disk_and_kept_apart_by_how_the_prompt_is_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outputs.jsonl"
    whole = CachedRunner(ScriptedModel(default="3.14 * r * r"), path)
    assert ask(whole) == "3.14 * r * r" and (whole.hits, whole.misses) == (0, 1)
    again = CachedRunner(ScriptedModel(default="something else"), path)
    assert ask(again) == "3.14 * r * r" and again.hits == 1  # from the file: the model not asked
    split = CachedRunner(SplittingModel(default="3.14 * (r ** 2)"), path)
    assert ask(split) == "3.14 * (r ** 2)" and (split.hits, split.misses) == (0, 1)
    path.write_text(path.read_text() + '{"key": "cut', encoding="utf-8")  # a killed run's last line
    assert ask(CachedRunner(SplittingModel(default="x"), path)) == "3.14 * (r ** 2)"


class AdaptableModel(ScriptedModel):
    """A model that serves an adapter: its id changes with the adapter's name, and it answers
    what the adapter's weights say."""

    adapter: Path | None = None  # `AdapterRunner`: the adapter serving now

    def swap_adapter(self, adapter: Path | None) -> None:
        self.adapter = adapter
        self.model_id = "scripted" if adapter is None else f"scripted+{adapter.name}"
        self.default = "3.14 * r * r" if adapter is None else (adapter / "weights").read_text()


def _adapter(directory: Path, answer: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "weights").write_text(answer)
    files = {"weights": hashlib.sha256(answer.encode()).hexdigest()}
    (directory / MANIFEST).write_text(json.dumps({"files": files}))
    return directory


def test_an_adapter_swapped_through_the_cache_keeps_its_outputs_apart(tmp_path: Path) -> None:
    runner = CachedRunner(AdaptableModel(default="3.14 * r * r"), tmp_path / "outputs.jsonl")
    assert ask(runner) == "3.14 * r * r"
    runner.swap_adapter(_adapter(tmp_path / "one" / "adapter", "r ** 2 * 3.14"))
    assert ask(runner) == "r ** 2 * 3.14" and runner.misses == 2  # not the base model's answer
    # Another training's adapter under the same name: its own outputs, not the first one's.
    runner.swap_adapter(_adapter(tmp_path / "two" / "adapter", "math.pi * r * r"))
    assert ask(runner) == "math.pi * r * r" and runner.misses == 3
    runner.swap_adapter(None)
    assert ask(runner) == "3.14 * r * r" and runner.hits == 1


def test_a_runner_without_adapters_says_so(tmp_path: Path) -> None:
    runner = CachedRunner(ScriptedModel(default="x"), tmp_path / "outputs.jsonl")
    with pytest.raises(TypeError, match="cannot serve an adapter"):
        runner.swap_adapter(tmp_path / "v1")
