from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from training.feedback import Feedback, FeedbackStore, as_example, stream_feedback_examples


def _item(i: int, outcome: str = "accepted", reward: float = 1.0) -> Feedback:
    return Feedback(f"m{i}.py", f"x = {i}\n", f"y = {i}", "\n", outcome, reward, 0.5)


def test_store_is_bounded_and_keeps_the_newest(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite", max_rows=5)
    for i in range(12):
        store.record(_item(i))
    assert store.count() == 5
    assert [r.path for r in store.rows(store.last_id())] == [f"m{i}.py" for i in range(7, 12)]
    store.close()
    reopened = FeedbackStore(tmp_path / "feedback.sqlite", max_rows=5)
    assert reopened.count() == 5


def test_bad_propensity_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    store.record(_item(1))
    with pytest.raises(ValueError, match="propensity"):
        store.record(Feedback("a.py", "", "x", "", "accepted", 1.0, 0.0))
    assert store.count() == 1


def test_examples_carry_advantage_and_clipped_weight(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    store.record(_item(1, "accepted", 3.0))
    store.record(Feedback("b.py", "p", "bad", "s", "ignored", -1.0, 0.01))
    examples = list(islice(stream_feedback_examples(store, 2), 4))
    assert [e.source for e in examples] == ["feedback"] * 4
    accepted, ignored = examples[0], examples[1]
    assert accepted.advantage == pytest.approx(1.0)  # (3 - 1) / 2
    assert ignored.advantage == pytest.approx(-1.0)
    assert ignored.weight == pytest.approx(20.0)  # 1 / max(0.01, 0.05)
    assert as_example(_item(2), baseline=1.0, scale=1.0).advantage == 0.0


def test_rows_after_the_mark_are_not_streamed(tmp_path: Path) -> None:
    store = FeedbackStore(tmp_path / "feedback.sqlite")
    store.record(_item(1))
    mark = store.last_id()
    store.record(_item(2))
    assert [r.path for r in store.rows(mark)] == ["m1.py"]
