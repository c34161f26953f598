"""A workspace's adapter canary judged from the local feedback store: rows carry the model
version that wrote them, and the verdict promotes the canary or rolls it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fake_adapter import FAKE_BASE_MODEL, fake_adapter
from training.feedback import Feedback, FeedbackStore, feedback_reward
from training.local_canary import LOCAL_CANARY, settle_local_canary, workspace_label
from training.registry import AdapterRegistry


@pytest.fixture
def canaried(tmp_path: Path) -> tuple[AdapterRegistry, FeedbackStore]:
    registry = AdapterRegistry(tmp_path / "scope")
    for fill in (1, 2):
        registry.add(fake_adapter(tmp_path / f"a{fill}", fill), FAKE_BASE_MODEL, {})
    registry.promote(1, force=True)
    registry.promote(2, force=True, canary_share=LOCAL_CANARY.share)
    store = FeedbackStore(tmp_path / "feedback.sqlite", workspace=tmp_path / "ws")
    return registry, store


def _keep(store: FeedbackStore, version: int | None, accepted: int, ignored: int) -> None:
    for n in range(accepted + ignored):
        kind = "accepted" if n < accepted else "ignored"
        reward = feedback_reward(kind, None, "x = 1")
        assert reward is not None
        label = workspace_label(version)
        store.record(Feedback("a.py", "p", "x = 1", "", kind, reward, 0.5, label))


def test_a_worse_workspace_canary_is_rolled_back(
    canaried: tuple[AdapterRegistry, FeedbackStore],
) -> None:
    registry, store = canaried
    _keep(store, 2, 10, 60)
    _keep(store, 1, 45, 25)
    _keep(store, None, 70, 0)  # the base model's rows judge neither arm
    verdict = settle_local_canary(registry, store)
    assert verdict is not None and verdict["outcome"] == "rollback", verdict
    assert verdict["canary_decisions"] == 70 and verdict["serving_decisions"] == 70
    assert registry.canary() is None and registry.serving() == 1
    assert registry.get(2).status == "rolled-back"


def test_a_better_workspace_canary_serves_alone(
    canaried: tuple[AdapterRegistry, FeedbackStore],
) -> None:
    registry, store = canaried
    _keep(store, 2, 50, 20)
    _keep(store, 1, 30, 40)
    verdict = settle_local_canary(registry, store)
    assert verdict is not None and verdict["outcome"] == "promote", verdict
    assert registry.canary() is None and registry.serving() == 2
    assert registry.transitions()[-1]["actor"] == "canary"
    assert settle_local_canary(registry, store) is None  # nothing runs any more


def test_too_little_feedback_waits(canaried: tuple[AdapterRegistry, FeedbackStore]) -> None:
    registry, store = canaried
    _keep(store, 2, 0, 20)
    _keep(store, 1, 20, 0)
    verdict = settle_local_canary(registry, store)
    assert verdict is not None and verdict["outcome"] == "wait"
    assert registry.canary() is not None


def test_rows_of_a_store_from_before_model_versions_read(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL,"
        " path TEXT NOT NULL, prefix TEXT NOT NULL, suggestion TEXT NOT NULL, suffix TEXT NOT"
        " NULL, outcome TEXT NOT NULL, reward REAL NOT NULL, propensity REAL NOT NULL,"
        " workspace TEXT)"
    )
    db.commit()
    db.close()
    store = FeedbackStore(path, workspace=tmp_path / "ws")
    store.record(Feedback("a.py", "p", "y", "", "accepted", 1.0, 1.0, "workspace:v0001"))
    assert store.rewards_by_model(["workspace:v0001", "base"], 0.0) == {
        "workspace:v0001": [1.0],
        "base": [],
    }
