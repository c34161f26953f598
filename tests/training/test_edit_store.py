"""The server's own next-edit examples: kept per workspace, read newest first, mixed into the
workspace's run as a share of what it trains on, with the prompt read verbatim."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from completion.fim import template_for
from completion.next_edit import NextEditSettings
from completion.next_edit.prompt import FILE_SEP
from training.edit_examples import EDIT_KIND, EditExample
from training.edit_store import EditExampleStore
from training.examples import FimExample
from training.feedback import FEEDBACK_FILE
from training.trainer import TrainSettings, encode
from training.window import TrainingWindow
from training.workspace import (
    EDIT_PROMPT_TOKENS,
    EDIT_SHARE,
    edit_train_settings,
    example_stream,
    live_edit_examples,
)

ROOT = Path(__file__).resolve().parents[2]


def _example(n: int, *, change: bool = True, prompt_words: int = 4) -> EditExample:
    current = f"x = {n}\n"
    target = f"x = {n} + 1\n" if change else current
    prompt = " ".join(["word"] * prompt_words) + f"\n{FILE_SEP}updated/f{n}.py\n"
    return EditExample(f"f{n}.py", prompt, current, target, "live")


def test_a_workspace_reads_its_own_examples_newest_first_and_keeps_a_bounded_number(
    tmp_path: Path,
) -> None:
    mine = EditExampleStore(tmp_path / "store.sqlite", max_rows=3, workspace=tmp_path / "a")
    theirs = EditExampleStore(tmp_path / "store.sqlite", workspace=tmp_path / "b")
    for n in range(5):
        mine.record(_example(n))
    theirs.record(_example(99))
    assert mine.count() == 3 and theirs.count() == 1
    upto = mine.last_id()
    assert [e.path for e in mine.examples(upto)] == ["f4.py", "f3.py", "f2.py"]
    mine.record(_example(5))
    # A run reads up to the id it started at: a later example is not in it.
    assert [e.path for e in mine.examples(upto)] == ["f4.py", "f3.py"]
    assert [e.path for e in theirs.examples(theirs.last_id())] == ["f99.py"]
    # What the training loop counts as new since a run started: this workspace's alone.
    assert mine.count_after(upto) == 1 and mine.count_after(0) == 3
    assert theirs.count_after(0) == 1
    mine.close()
    theirs.close()


def test_a_run_holds_out_the_newest_and_drops_what_the_trainer_would_cut(
    tmp_path: Path,
) -> None:
    store = EditExampleStore(tmp_path / "store.sqlite", workspace=tmp_path)
    store.record(_example(0, prompt_words=200))
    for n in range(1, 8):
        store.record(_example(n))
    for n in range(8, 20):
        store.record(_example(n, change=False))
    settings = TrainSettings(max_prompt_tokens=96)  # 72 tokens for the prompt

    def words(text: str) -> int:
        return len(text.split())

    kept, counts = live_edit_examples(store, store.last_id(), words, settings)
    assert counts == {
        "stored": 20,
        "edit": 7,
        "no_change": 3,  # 30% of what is kept
        "held_out": 2,  # the newest of every 10, for the judgement
        "dropped_prompt_too_long": 1,
        "dropped_no_change_over_share": 7,
        "upto_id": 20,
        "trained_through_id": 18,
    }
    assert [e.path for e in kept if not e.no_change] == [f"f{n}.py" for n in range(7, 0, -1)]
    assert not {"f18.py", "f19.py"} & {e.path for e in kept}
    # The held-out ones are those after the id trained through.
    held = store.examples(counts["upto_id"], after_id=counts["trained_through_id"])
    assert [e.path for e in held] == ["f19.py", "f18.py"]
    assert live_edit_examples(store, 0, words, settings) == ([], {})
    assert live_edit_examples(None, 5, words, settings) == ([], {})
    store.close()


def test_the_run_trains_a_share_of_edit_examples_newest_first(workspace: Path) -> None:
    edits = [_example(n) for n in (3, 2, 1)]  # newest first
    empty = TrainingWindow(None, (), (), ())
    make = example_stream(workspace, ["json/decoder.py"], 0, None, empty, {}, edits)
    drawn = list(itertools.islice(make(), 50))
    kinds = [e.kind for e in drawn]
    assert kinds.count(EDIT_KIND) == round(50 * EDIT_SHARE)
    assert [e.path for e in drawn if e.kind == EDIT_KIND][:3] == ["f3.py", "f2.py", "f1.py"]
    assert [(e.path, e.kind) for e in itertools.islice(make(), 50)] == [
        (e.path, e.kind) for e in drawn
    ]  # the same sequence every time: a resumed run needs it
    without = list(
        itertools.islice(example_stream(workspace, ["json/decoder.py"], 0, None, empty, {})(), 50)
    )
    assert all(e.kind != EDIT_KIND for e in without)


def test_an_edit_examples_prompt_is_read_verbatim(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    example = _example(1).fim()
    encoded = encode(example, tokenizer, template_for("qwen"), 96, 64)
    assert encoded is not None
    prompt = tokenizer.encode(example.prefix, add_special_tokens=False)
    assert encoded.ids[: encoded.prompt_len] == prompt  # no FIM markers around it
    completion = FimExample("f.py", "x = ", "1", "\n", "line")
    fim = encode(completion, tokenizer, template_for("qwen"), 96, 64)
    assert fim is not None and fim.ids[: fim.prompt_len] != tokenizer.encode(
        "x = ", add_special_tokens=False
    )


def test_a_next_edit_prompt_has_its_own_budget_beside_a_completions(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """A real next-edit prompt (about 650 tokens at the median) is longer than a completion's
    (384): the loop keeps it whole, where three quarters of a completion's budget cut it."""
    from transformers import AutoTokenizer

    defaults = TrainSettings()
    with_edits = edit_train_settings(defaults, NextEditSettings())
    assert with_edits.max_prompt_tokens == defaults.max_prompt_tokens  # completions unchanged
    assert with_edits.edit_prompt_tokens == EDIT_PROMPT_TOKENS
    assert defaults.edit_prompt_tokens == defaults.max_prompt_tokens * 3 // 4
    store = EditExampleStore(tmp_path / "store.sqlite", workspace=tmp_path)
    store.record(_example(0, prompt_words=650))
    store.record(_example(1, prompt_words=EDIT_PROMPT_TOKENS + 1))

    def words(text: str) -> int:
        return len(text.split()) - 1  # the marker line is one word

    kept, counts = live_edit_examples(store, store.last_id(), words, with_edits)
    assert [e.path for e in kept] == ["f0.py"] and counts["dropped_prompt_too_long"] == 1
    _, cut = live_edit_examples(store, store.last_id(), words, defaults)
    assert cut["dropped_prompt_too_long"] == 2
    store.close()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    example = _example(2, prompt_words=400).fim()
    prompt = tokenizer.encode(example.prefix, add_special_tokens=False)
    assert with_edits.max_prompt_tokens < len(prompt) < with_edits.edit_prompt_tokens
    budgets = (with_edits.max_prompt_tokens, with_edits.max_middle_tokens)
    whole = encode(example, tokenizer, template_for("qwen"), *budgets, 1.0, EDIT_PROMPT_TOKENS)
    assert whole is not None and whole.ids[: whole.prompt_len] == prompt
    cut_short = encode(example, tokenizer, template_for("qwen"), *budgets)
    assert cut_short is not None and cut_short.prompt_len == defaults.max_prompt_tokens * 3 // 4


def test_the_tokens_an_edit_writes_weigh_more_than_those_it_copies(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    example = EditExample("f.py", "p\n", "a = 1\nb = 2\nc = 3\n", "a = 1\nb = 20\nc = 3\n", "live")
    encoded = encode(example.fim(), tokenizer, template_for("qwen"), 96, 64, edit_token_weight=5.0)
    assert encoded is not None and encoded.token_weights is not None
    middle = encoded.ids[encoded.prompt_len :]
    assert len(encoded.token_weights) == len(middle)
    weighed = {w: "" for w in encoded.token_weights}
    for token, w in zip(middle, encoded.token_weights, strict=True):
        weighed[w] += str(tokenizer.decode([token]))
    # The digit the edit adds; the copied lines, the end marker and the end of text weigh 1.
    assert weighed == {1.0: f"a = 1\nb = 2\nc = 3\n{FILE_SEP}<|endoftext|>", 5.0: "0"}

    same = EditExample("f.py", "p\n", "a = 1\n", "a = 1\n", "live")
    unchanged = encode(same.fim(), tokenizer, template_for("qwen"), 96, 64, edit_token_weight=5.0)
    assert unchanged is not None and set(unchanged.token_weights or []) == {1.0}
    plain = encode(example.fim(), tokenizer, template_for("qwen"), 96, 64)
    assert plain is not None and plain.token_weights is None and plain.ids == encoded.ids
    completion = FimExample("f.py", "x = ", "1", "\n", "line")
    fim = encode(completion, tokenizer, template_for("qwen"), 96, 64, edit_token_weight=5.0)
    assert fim is not None and fim.token_weights is None  # completions are not weighted


def test_train_model_reads_the_workspaces_edit_examples(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    store = EditExampleStore(cache / FEEDBACK_FILE, workspace=workspace)
    for n in range(12):
        store.record(_example(n))
    store.close()
    command = [
        sys.executable, "-m", "tabloop", "train", "model",
        "--workspace", str(workspace), "--model", str(tiny_model_path),
        "--samples", "8", "--micro-batch", "2", "--effective-batch", "4",
        "--max-prompt-tokens", "96", "--rank", "4", "--eval-n", "2", "--json",
    ]  # fmt: skip
    environ = {**os.environ, "TABLOOP_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["edit_examples"] == {
        "stored": 12,
        "edit": 11,
        "no_change": 0,
        "held_out": 1,
        "dropped_prompt_too_long": 0,
        "dropped_no_change_over_share": 0,
        "upto_id": 12,
        "trained_through_id": 11,
    }
    # The version is judged on the next edit it held out (the newest), against the base model.
    assert report["evaluation"]["next_edits"]["n"] == 1
    # Room for a whole rewritten window as the middle, and for a whole next-edit prompt.
    assert report["training"]["settings"]["max_middle_tokens"] >= 256
    assert report["training"]["settings"]["max_edit_prompt_tokens"] == EDIT_PROMPT_TOKENS
