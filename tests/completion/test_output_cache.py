"""The evaluations' output cache: a prompt is run once per model, settings and way of reading it."""

from __future__ import annotations

from pathlib import Path

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
