"""The window under its token budget, and the prompt's format."""

from __future__ import annotations

from completion.next_edit.history import EditHistory
from completion.next_edit.prompt import (
    FILE_SEP,
    Window,
    build_prompt,
    choose_window,
    history_blocks,
    next_event_prefix,
    original_window,
)
from completion.next_edit.text import document_lines


class Counter:
    """Counts tokens as characters / 4 (rounded up) and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, text: str) -> int:
        self.asked.append(text)
        return max(1, -(-len(text) // 4))


LINES = [f"line {n:02d}\n" for n in range(100)]  # 8 characters, 2 tokens each


def test_the_window_is_the_cursor_and_ten_lines_each_side() -> None:
    window = choose_window(LINES, 50, radius=10, max_tokens=1000, count_tokens=Counter())
    assert window is not None
    assert (window.start, window.end) == (40, 61)
    assert window.text == "".join(LINES[40:61])


def test_the_window_shrinks_to_its_token_budget_nearest_lines_first() -> None:
    window = choose_window(LINES, 50, radius=10, max_tokens=10, count_tokens=Counter())
    assert window is not None
    assert window.tokens <= 10
    assert (window.start, window.end) == (48, 53)


def test_the_window_stops_at_the_document_edges() -> None:
    window = choose_window(LINES, 2, radius=10, max_tokens=1000, count_tokens=Counter())
    assert window is not None and (window.start, window.end) == (0, 13)


def test_a_very_long_line_ends_the_window_without_being_tokenized() -> None:
    lines = [*LINES[:50], "x" * 100_000 + "\n", *LINES[50:]]
    counter = Counter()
    window = choose_window(lines, 47, radius=10, max_tokens=256, count_tokens=counter)
    assert window is not None
    assert window.end == 50  # the long line (50) and what is beyond it are left out
    assert window.start == 37
    assert all(len(text) < 1000 for text in counter.asked)


def test_no_window_when_the_cursor_line_alone_is_too_long() -> None:
    lines = ["y" * 100_000 + "\n"]
    assert choose_window(lines, 0, radius=10, max_tokens=256, count_tokens=Counter()) is None


def test_the_prompt_has_recent_edits_then_original_current_and_open_updated() -> None:
    history = EditHistory(clock=lambda: 0.0)
    text = "def f(a):\n    return a\n\nprint(f(1))\n"
    after = text.replace("f(a)", "f(value)")
    history.record_edit("pkg/m.py", document_lines(after), 0, 6, "a", "value")
    window = Window(0, tuple(document_lines(after)))
    latest = history.latest("pkg/m.py")
    blocks = history_blocks(history.events(), max_events=3, max_tokens=500, count_tokens=Counter())
    prompt = build_prompt("pkg/m.py", blocks, original_window(window, latest), window)
    head = "    return a\n\n"  # two lines of context below the edited line
    assert prompt == (
        f"{FILE_SEP}pkg/m.py.diff\noriginal:\ndef f(a):\n{head}updated:\ndef f(value):\n{head}"
        f"{FILE_SEP}original/pkg/m.py\n{text}"
        f"{FILE_SEP}current/pkg/m.py\n{after}"
        f"{FILE_SEP}updated/pkg/m.py\n"
    )


def test_history_keeps_the_newest_events_that_fit() -> None:
    clock = [0.0]
    history = EditHistory(clock=lambda: clock[0])
    text = "".join(LINES)
    for n in range(5):
        clock[0] += 5
        lines = list(document_lines(text))
        lines[n * 20] = "edited " + lines[n * 20]
        text = "".join(lines)
        history.record_edit("a.py", document_lines(text), n * 20, 0, "", "edited ")
    blocks = history_blocks(
        history.events(), max_events=3, max_tokens=10_000, count_tokens=Counter()
    )
    assert len(blocks) == 3
    assert "edited line 80" in blocks[-1] and "edited line 40" in blocks[0]
    one = history_blocks(history.events(), max_events=3, max_tokens=40, count_tokens=Counter())
    assert len(one) == 1 and "edited line 80" in one[0]


def edit_line(history: EditHistory, text: str, line: int, at: float, word: str = "edited ") -> str:
    """`word` typed at the start of `line`, recorded at `at`; the text after it."""
    lines = list(document_lines(text))
    lines[line] = word + lines[line]
    text = "".join(lines)
    history.record_edit("a.py", document_lines(text), line, 0, "", word, now=at)
    return text


def test_the_next_events_prompt_starts_with_the_blocks_read_ahead() -> None:
    history = EditHistory(clock=lambda: 0.0)
    text = "".join(LINES)
    for n in range(4):
        text = edit_line(history, text, n * 20, at=5.0 * n)
    count = Counter()
    ahead = next_event_prefix(history.events(), max_events=3, max_tokens=500, count_tokens=count)
    # The two newest events: the next event's block comes after them.
    assert ahead.count(FILE_SEP) == 2 and "edited line 40" in ahead and "edited line 60" in ahead
    text = edit_line(history, text, 90, at=30.0)
    blocks = history_blocks(history.events(), max_events=3, max_tokens=500, count_tokens=count)
    window = Window(85, tuple(document_lines(text)[85:95]))
    prompt = build_prompt("a.py", blocks, original_window(window, history.events()[-1]), window)
    assert prompt.startswith(ahead) and "edited line 90" in prompt[len(ahead) :]
    # A prompt of one event has no start to read ahead; a block the budget leaves no room for
    # beside them drops the oldest, and the prompt starts otherwise.
    assert (
        next_event_prefix(history.events(), max_events=1, max_tokens=500, count_tokens=count) == ""
    )
    text = edit_line(history, text, 99, at=35.0, word="x" * 120 + " ")
    tight = history_blocks(history.events(), max_events=3, max_tokens=100, count_tokens=count)
    assert len(tight) == 2 and "x" * 120 in tight[-1]
    assert not "".join(tight).startswith(
        next_event_prefix(history.events()[:-1], max_events=3, max_tokens=100, count_tokens=count)
    )
