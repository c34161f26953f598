"""Next-edit training examples: the predictor's prompt, the settled window as the target, from a
replayed history and from a live history alike."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from completion.next_edit import EditHistory, NextEditSettings
from completion.next_edit.prompt import FILE_SEP
from completion.next_edit.text import document_lines
from tests.support.git_repo import make_repo
from training.edit_examples import (
    EDIT_TEMPLATE,
    EditExample,
    HistoryRead,
    edit_example,
    history_laps,
    read_after,
    replay_examples,
    settled_window,
    stream_edit_examples,
)
from training.edit_replay import EditPoint, GitHistory, ReplaySettings, replay_commits

LINES = [f"line {i}\n" for i in range(10)]


def words(text: str) -> int:
    """A stand-in tokenizer: a token per word."""
    return len(text.split()) + 1


def changed(changes: dict[int, list[str]]) -> list[str]:
    out: list[str] = []
    for number, line in enumerate(LINES):
        out += changes.get(number, [line])
    return out


@pytest.mark.parametrize(
    ("settled", "expected"),
    [
        pytest.param(LINES, "".join(LINES[3:7]), id="unchanged"),
        pytest.param(changed({4: ["LINE 4\n"]}), "line 3\nLINE 4\nline 5\nline 6\n", id="inside"),
        pytest.param(changed({1: ["LINE 1\n"]}), "".join(LINES[3:7]), id="above"),
        pytest.param(changed({8: ["x\n", "y\n"]}), "".join(LINES[3:7]), id="below"),
        pytest.param(changed({2: ["LINE 2\n"], 3: ["LINE 3\n"]}), None, id="across-the-top"),
        pytest.param(changed({6: ["LINE 6\n"], 7: ["LINE 7\n"]}), None, id="across-the-bottom"),
        # Lines inserted right above the window are inside it, right below it outside.
        pytest.param(
            changed({3: ["new\n", "line 3\n"]}), "new\n" + "".join(LINES[3:7]), id="on-top"
        ),
        pytest.param(changed({7: ["new\n", "line 7\n"]}), "".join(LINES[3:7]), id="under"),
    ],
)
def test_the_settled_window(settled: list[str], expected: str | None) -> None:
    assert settled_window(LINES, settled, 3, 7) == expected


def test_a_live_example_is_what_the_predictor_would_be_asked() -> None:
    # The user renamed `total` where it is defined; some seconds later its use was renamed too.
    before = (
        "def f(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total\n"
    )
    now = before.replace("    total = 0", "    sum_ = 0")
    settled = now.replace("total += v", "sum_ += v").replace("return total", "return sum_")
    history = EditHistory(clock=lambda: 0.0)
    assert history.record_edit("f.py", document_lines(now), 1, 4, "total", "sum_", now=1.0)
    settings = NextEditSettings()
    example = edit_example("f.py", now, (1, 8), history, settled, words, settings)
    assert example is not None
    assert example.current == now and example.target == settled and not example.no_change
    # The prompt: the edit as an original/updated block, the window before the edit, now, and
    # the open updated window; the model is taught to write the settled window and stop.
    assert example.prompt.startswith(f"{FILE_SEP}f.py.diff\noriginal:\n")
    assert f"{FILE_SEP}original/f.py\n{before}{FILE_SEP}current/f.py\n{now}" in example.prompt
    assert example.prompt.endswith(f"{FILE_SEP}updated/f.py\n")
    fim = example.fim()
    assert (fim.middle, fim.suffix) == (settled + FILE_SEP, "")
    assert EDIT_TEMPLATE.build(fim.prefix, fim.suffix, (), "f.py") == example.prompt


BASE = "".join(f"a_{i} = {i}\n" for i in range(30)).replace("a_13 = 13", "a_13 = new_name")


@pytest.fixture
def points(tmp_path: Path) -> list[EditPoint]:
    # Commit 1: two nearby edits (an edit point and a no-change point after the last).
    # Commit 2: a change, then one nearby that puts back what the first took out.
    # Commit 3: two edits far apart (a no-change point: the next is outside the window).
    one = BASE.replace("a_3 = 3", "a_3 = 33").replace("a_6 = 6", "a_6 = 66")
    two = one.replace("a_10 = 10", "a_10 = new_name").replace("a_13 = new_name", "a_13 = 10")
    three = two.replace("a_1 = 1\n", "a_1 = 11\n").replace("a_28 = 28", "a_28 = 0")
    root = tmp_path / "repo"
    make_repo(root, [{"m.py": BASE}, {"m.py": one}, {"m.py": two}, {"m.py": three}])
    history = GitHistory(root)
    found, _ = replay_commits(history, history.commits(None, 0, (".py",)), ReplaySettings())
    return found


def test_examples_from_a_history(points: list[EditPoint]) -> None:
    assert [p.kind for p in points] == [
        "edit",
        "no_change_after_last",
        "edit",
        "no_change_after_last",
        "no_change_outside_window",
        "no_change_after_last",
    ]
    settings = NextEditSettings()
    examples, counts = replay_examples(
        points, words, settings, max_prompt_tokens=10_000, no_change_share=0.5
    )
    # The second commit's next edit takes out `new_name` for `10`, the inverse of its first
    # edit: dropped.
    # Four no-change points, one edit: one no-change example kept (half of the whole).
    assert counts.summary() == {
        "dropped_no_change_over_share": 3,
        "dropped_undoes_previous_edit": 1,
        "edit": 1,
        "no_change": 1,
    }
    edit = next(e for e in examples if not e.no_change)
    assert "a_3 = 33\n" in edit.current and "a_6 = 6\n" in edit.current
    assert edit.target == edit.current.replace("a_6 = 6\n", "a_6 = 66\n")
    assert edit.source == "history"

    none, counts = replay_examples(
        points, words, settings, max_prompt_tokens=10_000, no_change_share=0
    )
    assert all(not e.no_change for e in none) and counts.counts["no_change"] == 0
    short, counts = replay_examples(points, words, settings, max_prompt_tokens=20)
    assert short == [] and counts.counts["dropped_prompt_too_long"] == 5
    with pytest.raises(ValueError, match="no_change_share"):
        replay_examples(points, words, settings, max_prompt_tokens=1, no_change_share=1.0)


def test_the_stream_is_a_pure_function_of_the_seed(points: list[EditPoint]) -> None:
    examples, _ = replay_examples(points, words, NextEditSettings(), max_prompt_tokens=10_000)
    first = stream_edit_examples(examples, seed=3)
    second = stream_edit_examples(examples, seed=3)
    taken = [next(first) for _ in range(3 * len(examples))]
    assert taken == [next(second) for _ in range(3 * len(examples))]
    # Every epoch holds every example once.
    assert sorted(e.prefix for e in taken[: len(examples)]) == sorted(e.prompt for e in examples)
    assert list(stream_edit_examples([], seed=3)) == []


def _made(n: int) -> list[EditExample]:
    return [
        EditExample(f"m{k}.py", f"prompt {k}\n", "x = 1\n", f"x = {k}\n", "history")
        for k in range(n)
    ]


def test_a_chain_of_runs_reads_what_one_long_run_reads() -> None:
    examples = _made(7)
    one_run = [example for _, example in itertools.islice(history_laps(examples, 5), 20)]
    # A fresh run reads the first lap in the order the stream always had.
    assert [e.fim() for e in one_run[:7]] == list(
        itertools.islice(stream_edit_examples(examples, 5), 7)
    )
    read, chained = HistoryRead(), []
    for count in (3, 4, 6, 2, 5):  # runs that each read `count`, each warm-started from the last
        chained += [
            example for _, example in itertools.islice(history_laps(examples, 5, read), count)
        ]
        read = read_after(examples, 5, read, count)
    assert chained == one_run
    # 20 read: two laps of 7, and 6 of the third.
    assert read.lap == 2 and read.keys == {e.key for e in one_run[14:]}
    assert read.unread(examples) == 1

    # Every lap holds every example once, in an order of its own.
    def keys(found: list[EditExample]) -> list[str]:
        return sorted(e.key for e in found)

    assert keys(one_run[:7]) == keys(one_run[7:14]) == keys(examples)
    assert one_run[:7] != one_run[7:14]


def test_a_read_record_survives_its_file_and_a_damaged_one_starts_over() -> None:
    examples = _made(4)
    read = read_after(examples, 0, HistoryRead(), 3)
    assert HistoryRead.from_record(json.loads(json.dumps(read.record()))) == read
    for damaged in (None, [], {"lap": -1, "keys": []}, {"lap": 0, "keys": "abc"}, {"keys": []}):
        assert HistoryRead.from_record(damaged) == HistoryRead()
    # An example gone from the history (its commit no longer among those replayed) is forgotten,
    # and the keys of the examples still there are kept.
    kept = read_after(examples[1:], 0, read, 0)
    assert kept.keys == read.keys - {examples[0].key} and kept.lap == 0
    # The key is the example's content: the same example made again has the same key.
    again = EditExample(examples[2].path, examples[2].prompt, "x = 1\n", examples[2].target, "live")
    assert again.key == examples[2].key and examples[1].key != examples[2].key


def test_the_rest_of_a_lap_reads_the_new_commits_first() -> None:
    old = [replace(e, commit="old") for e in _made(5)]
    new = [replace(e, commit="new", path=f"n{k}.py") for k, e in enumerate(_made(3))]
    examples = [*old, *new]
    read = read_after(old, 1, HistoryRead(), 2)  # the predecessor read 2 of the 5 it had
    laps = list(itertools.islice(history_laps(examples, 1, read, known={"old"}), 6 + 8))
    # The rest of its lap: the 3 new examples, then the 3 old ones it had not read, each part in
    # the lap's seeded order; then a whole lap in an order of its own.
    assert [e.commit for _, e in laps[:6]] == ["new"] * 3 + ["old"] * 3
    assert not {e.key for _, e in laps[3:6]} & read.keys
    lap_order = [e.key for _, e in itertools.islice(history_laps(examples, 1), 8)]
    assert [e.key for _, e in laps[:6]] == [
        *(k for k in lap_order if k in {e.key for e in new}),
        *(k for k in lap_order if k in {e.key for e in old} - read.keys),
    ]
    assert [at for at, _ in laps] == [0] * 6 + [1] * 8
    next_lap = itertools.islice(history_laps(examples, 1, HistoryRead(1)), 8)
    assert [e.key for _, e in laps[6:]] == [e.key for _, e in next_lap]
    # Without the commits the predecessor trained on, nothing is new: the lap's own order.
    plain = [e.key for _, e in itertools.islice(history_laps(examples, 1, read), 6)]
    assert plain == [k for k in lap_order if k not in read.keys]
    # Where the run stops is counted in the order it read.
    after = read_after(examples, 1, read, 4, known={"old"})
    assert after.lap == 0 and after.keys == read.keys | {e.key for _, e in laps[:4]}
