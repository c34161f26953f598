"""A tenant's examples from its events, posted through `/v1/events` (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from backend.adapters.dataset import (
    NO_JUDGEMENT,
    NO_OUTCOME,
    NO_TEXT,
    RETENTION_AFTER_S,
    SILENCE,
    TenantExamples,
    logged_feedback,
    newest_event_row,
)
from backend.policy.settings import RewardSettings
from tests.backend.adapters.events import Logged, logged, post, retention
from tests.support.backend_server import BackendServer
from training.feedback import DISTRACTION_SHARE, MAX_INVERSE_PROPENSITY
from training.window import WindowSettings


def _examples(backend: BackendServer, page_rows: int = 500) -> TenantExamples:
    storage = backend.services.storage
    return TenantExamples(
        storage,
        backend.tenant_id,
        newest_event_row(storage, backend.tenant_id),
        page_rows=page_rows,
    )


def _reward(item: Logged) -> float:
    """accepted 1, partial its accepted share (3 characters), ignored or dismissed -λ."""
    if item.outcome == "accepted":
        return 1.0
    if item.outcome == "partial":
        return 3 / len(item.suggestion)
    return -DISTRACTION_SHARE


def test_labels_weights_and_the_split_by_time(backend: BackendServer) -> None:
    items = logged(20)
    post(backend, items)
    data = _examples(backend, page_rows=3)  # several pages
    assert (data.train_count, data.held_out_count) == (16, 4)
    held = list(data.held_out())
    by_text = {i.suggestion: i for i in items}
    # The newest 20% by the decision's time, although they were not the newest rows.
    assert sorted(by_text[h.feedback.suggestion].minute for h in held) == [16, 17, 18, 19]
    training = list(data.training_examples())
    assert len(training) == 16
    train_items = [by_text[e.middle] for e in training]
    assert {i.minute for i in train_items} == set(range(16))
    expected = [_reward(i) for i in train_items]
    baseline = sum(expected) / len(expected)
    assert data.baseline == pytest.approx(baseline)
    for example, item, reward in zip(training, train_items, expected, strict=True):
        assert example.source == "feedback" and example.suffix == ""
        assert example.prefix == item.prompt and example.path == "untitled.py"
        assert example.weight == pytest.approx(min(1 / item.propensity, MAX_INVERSE_PROPENSITY))
        # The advantage: the reward less the training examples' mean reward, scaled to [-1, 1].
        assert example.advantage == pytest.approx((reward - baseline) / data.scale)
        assert -1.0 <= example.advantage <= 1.0
        if item.outcome == "accepted":
            assert example.advantage > 0
        elif item.outcome in ("ignored", "dismissed"):
            assert example.advantage < 0
    summary = data.summary()
    kinds = [i.outcome for i in items]
    assert summary["positive"] == kinds.count("accepted") + kinds.count("partial")
    assert summary["negative"] == kinds.count("ignored") + kinds.count("dismissed")
    # A stream is the same sequence every time (a resumed run skips exactly what it saw).
    first = list(zip(range(40), data.stream()(), strict=False))
    again = list(zip(range(40), data.stream()(), strict=False))
    assert [e for _, e in first] == [e for _, e in again]
    assert [e for _, e in first][16:32] == training  # the second epoch repeats the first


def test_events_without_text_or_outcome_are_skipped_and_counted(backend: BackendServer) -> None:
    with_text = logged(10)
    without_text = logged(6, text=False)
    silent = [dataclasses.replace(i, action="silence", outcome=None) for i in logged(2)]
    pending = [dataclasses.replace(i, outcome=None) for i in logged(3)]
    superseded = logged(2, outcomes=("superseded",))
    post(backend, with_text + without_text + silent + pending + superseded)
    data = _examples(backend)
    assert data.train_count + data.held_out_count == 10
    assert data.skipped[NO_TEXT] == 6
    assert data.skipped[SILENCE] == 2
    assert data.skipped[NO_OUTCOME] == 3
    assert data.skipped[NO_JUDGEMENT] == 2
    assert data.text_events == 10 + 3 + 2


def test_only_rows_up_to_the_mark_are_read(backend: BackendServer) -> None:
    post(backend, logged(10))
    storage = backend.services.storage
    mark = newest_event_row(storage, backend.tenant_id)
    post(backend, logged(10))
    data = TenantExamples(storage, backend.tenant_id, mark)
    assert data.train_count + data.held_out_count == 10


def test_a_tenant_without_text_has_no_examples(backend: BackendServer) -> None:
    post(backend, logged(5, text=False))
    data = _examples(backend)
    assert (data.train_count, data.held_out_count, data.text_events) == (0, 0, 0)
    assert list(data.stream()()) == []


def test_accepted_code_counts_by_the_share_still_there_at_the_checkpoint(
    backend: BackendServer,
) -> None:
    """Code accepted and then deleted taught less: the reward of an accepted suggestion is
    scaled by the share retained at the policy's checkpoint (120 s); other checkpoints, and
    suggestions without a reported checkpoint (fully retained), leave it whole."""
    items = logged(5, outcomes=("accepted", "partial", "accepted", "accepted", "ignored"))
    first, partial, kept, other_checkpoint, ignored = items
    post(
        backend,
        items,
        later=[
            retention(first, 120, len(first.suggestion) // 4),
            retention(partial, 120, 0),
            retention(other_checkpoint, 600, 0),
            retention(ignored, 120, 0),  # judges nothing: an ignored suggestion was not taken
        ],
    )
    rewards = {
        item.feedback.suggestion: item.feedback.reward
        for item in logged_feedback(
            backend.services.storage,
            backend.tenant_id,
            newest_event_row(backend.services.storage, backend.tenant_id),
        )
    }
    assert rewards[first.suggestion] == pytest.approx(
        (len(first.suggestion) // 4) / len(first.suggestion)
    )
    assert rewards[partial.suggestion] == 0.0
    assert rewards[kept.suggestion] == 1.0
    assert rewards[other_checkpoint.suggestion] == 1.0
    assert rewards[ignored.suggestion] == -DISTRACTION_SHARE
    assert RewardSettings().retention_after_s == RETENTION_AFTER_S


def test_a_mark_gives_the_new_examples_newest_first_and_replays_older_ones(
    backend: BackendServer,
) -> None:
    """After the serving version's mark (minute 19): the newest 20% held out, the rest newest
    first, and a quarter of each epoch replayed from before the mark."""
    items = logged(40)
    post(backend, items)
    everything = _examples(backend)
    assert everything.window.mark is None and len(everything.window.new) == 32
    mark = sorted(everything.window.trainable)[19]  # the 20th oldest by time: minute 19
    storage = backend.services.storage
    data = TenantExamples(
        storage,
        backend.tenant_id,
        newest_event_row(storage, backend.tenant_id),
        mark=mark,
        window=WindowSettings(replay_share=0.25, held_out_share=0.2),
    )
    by_text = {i.suggestion: i for i in items}
    held = sorted(by_text[h.feedback.suggestion].minute for h in data.held_out())
    assert held == [36, 37, 38, 39]
    assert (data.train_count, data.held_out_count) == (16 + 5, 4)
    minutes = [by_text[e.middle].minute for e in data.training_examples(seed=0)]
    assert [m for m in minutes if m >= 20] == list(range(35, 19, -1))  # newest first
    replayed = [m for m in minutes if m < 20]
    assert len(replayed) == 5 and minutes[3] < 20  # every fourth
    assert data.window.trained_through is not None
    assert by_text[next(iter(data.held_out())).feedback.suggestion].minute == 36
    assert data.summary()["held_out"] == 4


def test_nothing_crosses_between_tenants(backend: BackendServer) -> None:
    storage = backend.services.storage
    other = f"{backend.principal.tenant}-b"
    theirs = logged(12)
    post(SimpleNamespace(url=backend.url, token=storage.create_token(other)), theirs)  # type: ignore[arg-type]
    mine = logged(10)
    post(backend, mine)
    other_id = storage.tenant_id(other)
    assert other_id is not None and other_id != backend.tenant_id
    for tenant_id, items in ((backend.tenant_id, mine), (other_id, theirs)):
        data = TenantExamples(storage, tenant_id, newest_event_row(storage, tenant_id))
        seen = [e.middle for e in data.training_examples()]
        seen += [h.feedback.suggestion for h in data.held_out()]
        assert sorted(seen) == sorted(i.suggestion for i in items)
