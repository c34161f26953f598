from __future__ import annotations

import sqlite3
from itertools import islice
from pathlib import Path

import pytest

from training.feedback import Feedback, FeedbackStore, as_example, stream_feedback_examples
from training.window import WindowSettings, select_window


def _item(i: int, outcome: str = "accepted", reward: float = 1.0) -> Feedback:
    return Feedback(f"m{i}.py", f"x = {i}\n", f"y = {i}", "\n", outcome, reward, 0.5)


def test_store_is_bounded_and_keeps_the_newest(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", max_rows=5, workspace=tmp_path)
    for i in range(12):
        store.record(_item(i))
    assert store.count() == 5
    assert [r.path for r in store.rows(store.last_id())] == [f"m{i}.py" for i in range(7, 12)]
    store.close()
    reopened = FeedbackStore(tmp_path / "feedback.sqlite", max_rows=5, workspace=tmp_path)
    assert reopened.count() == 5


def test_bad_propensity_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    store.record(_item(1))
    with pytest.raises(ValueError, match="propensity"):
        store.record(Feedback("a.py", "", "x", "", "accepted", 1.0, 0.0))
    assert store.count() == 1


def test_nothing_crosses_between_workspaces(tmp_path: Path) -> None:
    """Two workspaces share the file; each view writes, counts, reads and bounds only its own
    rows, whatever ids it is asked for."""
    path = tmp_path / "feedback.sqlite"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = FeedbackStore(path, max_rows=3, workspace=tmp_path / "a")
    b = FeedbackStore(path, max_rows=3, workspace=tmp_path / "b")
    for i in range(5):
        a.record(_item(i))
        b.record(_item(100 + i, "ignored", -0.25))
    assert (a.count(), b.count()) == (3, 3)  # each bounded on its own: b did not evict a's
    assert [r.path for r in a.rows(a.last_id())] == ["m2.py", "m3.py", "m4.py"]
    assert [r.path for r in b.rows(b.last_id())] == ["m102.py", "m103.py", "m104.py"]
    assert a.outcome_counts() == {"accepted": 3} and b.outcome_counts() == {"ignored": 3}
    b_ids = [row for (_, row), _ in b.keys(b.last_id())]
    assert list(a.rows_by_id(b_ids)) == []  # another workspace's ids read nothing
    assert {reward for _, reward in a.keys(10**6)} == {1.0}
    window = select_window(dict(a.keys(10**6)), None, WindowSettings(held_out_share=0.0))
    examples = list(islice(stream_feedback_examples(a, window, dict(a.keys(10**6)), 0), 6))
    assert {e.path for e in examples} == {"m2.py", "m3.py", "m4.py"}


def test_a_workspace_is_known_by_its_real_path(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (tmp_path / "link").symlink_to(root)
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=root)
    store.record(_item(1))
    for other in (tmp_path / "link", root / "src" / "..", str(root) + "/"):
        view = FeedbackStore(tmp_path / "feedback.sqlite", workspace=other)
        assert view.count() == 1, other
    assert FeedbackStore(tmp_path / "feedback.sqlite", workspace=root / "src").count() == 0


def test_a_store_from_before_workspaces_is_migrated_and_its_rows_used_by_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "feedback.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL,"
        " path TEXT NOT NULL, prefix TEXT NOT NULL, suggestion TEXT NOT NULL,"
        " suffix TEXT NOT NULL, outcome TEXT NOT NULL, reward REAL NOT NULL,"
        " propensity REAL NOT NULL)"
    )
    for i in range(3):
        old.execute(
            "INSERT INTO feedback (created, path, prefix, suggestion, suffix, outcome, reward,"
            " propensity) VALUES (?, ?, 'p', 's', '', 'accepted', 1.0, 0.5)",
            (1000.0 + i, f"old{i}.py"),
        )
    old.commit()
    old.close()
    store = FeedbackStore(path, workspace=tmp_path)
    assert store.count() == 0 and store.keys(10**6) == [] and store.last_id() == 0
    assert store.unattributed() == 3  # kept, and counted, but read by no workspace
    store.record(_item(7))
    assert [r.path for r in store.rows(store.last_id())] == ["m7.py"]
    again = FeedbackStore(path, workspace=tmp_path)  # opening a migrated store changes nothing
    assert (again.count(), again.unattributed()) == (1, 3)


def test_examples_carry_advantage_and_clipped_weight(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    store.record(_item(1, "accepted", 3.0))
    store.record(Feedback("b.py", "p", "bad", "s", "ignored", -1.0, 0.01))
    rewards = dict(store.keys(store.last_id()))
    window = select_window(rewards, None, WindowSettings(held_out_share=0.0))
    examples = list(islice(stream_feedback_examples(store, window, rewards, seed=0), 4))
    assert [e.source for e in examples] == ["feedback"] * 4
    ignored, accepted = examples[0], examples[1]  # newest first
    assert accepted.advantage == pytest.approx(1.0)  # (3 - 1) / 2
    assert ignored.advantage == pytest.approx(-1.0)
    assert ignored.weight == pytest.approx(20.0)  # 1 / max(0.01, 0.05)
    assert as_example(_item(2), baseline=1.0, scale=1.0).advantage == 0.0


def test_held_out_rows_are_never_streamed_nor_in_the_baseline(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    for i in range(8):
        store.record(_item(i, "accepted" if i < 6 else "ignored", 1.0 if i < 6 else -0.25))
    rewards = dict(store.keys(store.last_id()))
    window = select_window(rewards, None, WindowSettings(held_out_share=0.25))
    examples = list(islice(stream_feedback_examples(store, window, rewards, seed=0), 12))
    assert {e.path for e in examples} == {f"m{i}.py" for i in range(6)}
    assert all(e.advantage == 0.0 for e in examples)  # the baseline is the trained rows' mean


def test_rows_after_the_mark_are_not_read(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    store.record(_item(1))
    mark = store.last_id()
    store.record(_item(2))
    assert [r.path for r in store.rows(mark)] == ["m1.py"]
    assert [row for (_, row), _ in store.keys(mark)] == [mark]


def test_the_kept_text_is_set_on_the_row_of_its_decision(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path)
    other = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path / "other")
    row = Feedback("a.py", "x = ", "f(1)", "", "accepted", 1.0, 0.5, kept="f(1)", decision_id="d")
    store.record(row)
    other.record(row)
    assert store.keep_text("d", "f(2)")
    assert not store.keep_text("unknown", "f(3)")
    assert [r.kept for r in store.rows(store.last_id())] == ["f(2)"]
    assert [r.kept for r in other.rows(other.last_id())] == ["f(1)"]  # its own workspace only
