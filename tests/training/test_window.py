"""The training window: new outcomes since the serving version's mark (newest first), a replayed
share of older ones, the newest held out."""

from __future__ import annotations

from collections import Counter

import pytest

from training.window import (
    OutcomeKey,
    WindowSettings,
    mark_of,
    select_window,
    window_problem,
)


def _keys(n: int) -> list[OutcomeKey]:
    # Times out of row order, as events from several editors arrive.
    return [(1000.0 + (i * 7) % n, 500 + i) for i in range(n)]


def test_without_a_mark_everything_is_new_and_the_newest_is_held_out() -> None:
    keys = _keys(10)
    window = select_window(keys, None, WindowSettings(replay_share=0.25, held_out_share=0.2))
    newest_first = sorted(keys, reverse=True)
    assert window.held_out == tuple(newest_first[:2])
    assert window.new == tuple(newest_first[2:])
    assert window.older == () and window.replayed == 0
    assert window.epoch(seed=0, number=0) == list(newest_first[2:])
    assert window.trained_through == newest_first[2]
    assert all(key > window.trained_through for key in window.held_out)


def test_with_a_mark_new_outcomes_come_first_and_older_ones_are_replayed() -> None:
    keys = [(float(t), t) for t in range(1, 101)]  # 100 outcomes
    window = select_window(keys, (60.0, 60), WindowSettings(replay_share=0.25, held_out_share=0.1))
    assert len(window.older) == 60 and len(window.held_out) == 4 and len(window.new) == 36
    assert window.held_out == tuple((float(t), t) for t in range(100, 96, -1))
    assert window.new[0] == (96.0, 96) and window.new[-1] == (61.0, 61)
    # A quarter of what an epoch trains on is replayed: 36 new, 12 older.
    assert window.replayed == 12
    epoch = window.epoch(seed=3, number=0)
    assert len(epoch) == 48 and len(set(epoch)) == 48
    assert [k for k in epoch if k > (60.0, 60)] == list(window.new)  # newest first
    replayed = [k for k in epoch if k <= (60.0, 60)]
    assert len(replayed) == 12 and replayed == sorted(replayed, reverse=True)
    # Every fourth example is a replay: new, new, new, replayed, ...
    assert [k <= (60.0, 60) for k in epoch[:8]] == [False, False, False, True] * 2
    assert not set(epoch) & set(window.held_out)
    assert window.trained_through == (96.0, 96)


def test_replays_are_drawn_by_the_seed_and_anew_each_epoch() -> None:
    keys = [(float(t), t) for t in range(1, 201)]
    window = select_window(keys, (150.0, 150), WindowSettings(replay_share=0.25))
    first = window.epoch(seed=1, number=0)
    assert first == window.epoch(seed=1, number=0)  # a resumed run sees the same
    assert first != window.epoch(seed=1, number=1)
    assert first != window.epoch(seed=2, number=0)
    seen: Counter[OutcomeKey] = Counter()
    for number in range(40):
        seen.update(k for k in window.epoch(seed=1, number=number) if k <= (150.0, 150))
    assert len(seen) > 100  # over epochs the replays cover most of the older outcomes


@pytest.mark.parametrize(
    ("total", "mark", "share", "replayed"),
    [
        pytest.param(20, 18, 0.25, 1, id="pool-larger-than-wanted"),
        pytest.param(20, 2, 0.5, 2, id="pool-smaller-than-wanted"),
        pytest.param(20, 20, 0.25, 0, id="nothing-new-no-replay"),
        pytest.param(20, 10, 0.0, 0, id="replay-off"),
    ],
)
def test_the_replay_count(total: int, mark: int, share: float, replayed: int) -> None:
    keys = [(float(t), t) for t in range(1, total + 1)]
    window = select_window(
        keys, (float(mark), mark), WindowSettings(replay_share=share, held_out_share=0.0)
    )
    assert window.replayed == replayed


def test_a_late_outcome_at_or_before_the_mark_is_older() -> None:
    keys = [(10.0, 1), (20.0, 2), (15.0, 3)]  # row 3 arrived last but was logged before 20
    window = select_window(keys, (20.0, 2), WindowSettings(held_out_share=0.0))
    assert window.new == () and set(window.older) == set(keys)
    assert window.trained_through == (20.0, 2)  # nothing new: the mark stays


@pytest.mark.parametrize("field", ["replay_share", "held_out_share"])
@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_settings_are_shares(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        WindowSettings(**{field: value})


def test_the_mark_a_version_records() -> None:
    window = select_window([(5.0, 1), (6.0, 2)], None, WindowSettings(held_out_share=0.0))
    train = {"window": window.summary()}
    assert train["window"]["trained_through"] == [6.0, 2]
    assert mark_of(train) == (6.0, 2)
    assert mark_of({}) is None and mark_of(None) is None
    assert window_problem(train) is None and window_problem({}) is None
    for bad in ([6.0], ["6", 2], [6.0, 2.5], [True, 2], "6,2"):
        assert window_problem({"window": {"trained_through": bad}}) is not None, bad
    assert window_problem({"window": []}) is not None
