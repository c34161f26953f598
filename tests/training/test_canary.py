"""The model canary's arms and verdicts, and the registry's canary transitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fake_adapter import FAKE_BASE_MODEL, fake_adapter
from training.canary import ModelCanarySettings, judge_arms, on_canary_arm
from training.registry import (
    REGISTRY_FILE,
    AdapterRegistry,
    AdapterRegistryError,
    parse_version_label,
    version_label,
)

RULE = ModelCanarySettings(min_decisions=50, max_decisions=400, tolerance=0.5)


def test_arms_are_stable_per_key_and_split_by_share() -> None:
    keys = [f"install-{n}" for n in range(4000)]
    on = [on_canary_arm(key, 7, 0.1) for key in keys]
    assert on == [on_canary_arm(key, 7, 0.1) for key in keys]
    assert 0.08 < sum(on) / len(on) < 0.12
    # A new canary draws its arms afresh: not the same clients each time.
    assert on != [on_canary_arm(key, 8, 0.1) for key in keys]
    assert not any(on_canary_arm(key, 7, 0.0) for key in keys[:50])
    assert all(on_canary_arm(key, 7, 1.0) for key in keys[:50])


def _rewards(good: int, bad: int) -> list[float]:
    return [20.0] * good + [-1.0] * bad


@pytest.mark.parametrize(
    ("canary", "serving", "outcome"),
    [
        pytest.param(_rewards(10, 90), _rewards(60, 40), "rollback", id="worse"),
        pytest.param(_rewards(70, 30), _rewards(50, 50), "promote", id="better"),
        pytest.param(_rewards(50, 50), _rewards(50, 50), "wait", id="undecided"),
        pytest.param(_rewards(200, 200), _rewards(200, 200), "rollback", id="undecided-too-long"),
        pytest.param(_rewards(5, 5), _rewards(60, 40), "wait", id="too-few"),
    ],
)
def test_verdicts(canary: list[float], serving: list[float], outcome: str) -> None:
    verdict = judge_arms(canary, serving, RULE)
    assert verdict.outcome == outcome, verdict.figures
    assert verdict.figures["canary_decisions"] == len(canary)


def test_version_labels() -> None:
    assert version_label(None) == "base" and version_label(3) == "v0003"
    assert parse_version_label("v0003") == 3 and parse_version_label("base") is None
    with pytest.raises(ValueError, match="not an adapter version"):
        parse_version_label("latest")


@pytest.fixture
def registry(tmp_path: Path) -> AdapterRegistry:
    registry = AdapterRegistry(tmp_path / "scope")
    for fill in (1, 2, 3):
        registry.add(fake_adapter(tmp_path / f"a{fill}", fill), FAKE_BASE_MODEL, {})
    return registry


def test_a_promotion_with_a_share_is_a_canary_until_judged(registry: AdapterRegistry) -> None:
    registry.promote(1, force=True)
    # Promoting what serves already changes nothing (no canary of a version beside itself).
    assert "serves already" in registry.promote(1, force=True, canary_share=0.5)
    assert registry.canary() is None and len(registry.transitions()) == 1
    reason = registry.promote(2, force=True, canary_share=0.25, actor="trainer")
    assert "canary at 25%" in reason
    canary = registry.canary()
    assert canary is not None and (canary.version, canary.previous) == (2, 1)
    assert registry.serving() == 1 and registry.get(2).status == "canary"
    keys = [f"k{n}" for n in range(200)]
    arms = {key: registry.serving_for(key) for key in keys}
    assert {arms[key] for key in keys} == {1, 2}
    assert all((arms[k] == 2) == on_canary_arm(k, 2, 0.25) for k in keys)
    with pytest.raises(AdapterRegistryError, match="canary v0002 is running"):
        registry.promote(3, force=True)
    with pytest.raises(AdapterRegistryError, match="not v0003"):
        registry.finish_canary(promote=True, version=3)
    assert registry.finish_canary(promote=True, version=2, actor="canary") == 2
    assert registry.canary() is None and registry.serving() == 2
    assert registry.get(1).status == "retired"
    actions = [(t["action"], t["version"]) for t in registry.transitions()]
    assert actions == [("promote", "v0001"), ("canary", "v0002"), ("canary-promote", "v0002")]
    # A rollback after the canary served alone serves the version before it again.
    assert registry.rollback() == 1


def test_rolling_back_during_a_canary_rolls_the_canary_back(registry: AdapterRegistry) -> None:
    registry.promote(1, canary_share=0.5, force=True)  # the first canary runs beside the base
    canary = registry.canary()
    assert canary is not None and canary.previous is None
    assert registry.rollback(actor="alice") is None
    assert registry.canary() is None and registry.serving() is None
    assert registry.get(1).status == "rolled-back"
    last = registry.transitions()[-1]
    assert (last["action"], last["version"], last["actor"]) == ("canary-rollback", "base", "alice")
    assert registry.serving_for("anyone") is None


def test_a_held_promotion_waits_for_approval(registry: AdapterRegistry) -> None:
    registry.promote(1, force=True, hold=True)
    assert registry.pending() == [1] and registry.serving() is None
    assert registry.get(1).status == "pending-approval"
    with pytest.raises(AdapterRegistryError, match="not waiting"):
        registry.approve(2)
    assert registry.approve(1) == "serving"
    assert registry.serving() == 1 and registry.pending() == []


def test_a_damaged_canary_is_refused(registry: AdapterRegistry) -> None:
    registry.promote(1, force=True, canary_share=0.1)
    path = registry.root / REGISTRY_FILE
    state = json.loads(path.read_text())
    state["canary"]["version"] = 99
    path.write_text(json.dumps(state))
    with pytest.raises(AdapterRegistryError, match="canary names no version"):
        registry.canary()


def test_a_registry_from_before_canaries_reads(registry: AdapterRegistry) -> None:
    registry.promote(1, force=True)
    path = registry.root / REGISTRY_FILE
    state = json.loads(path.read_text())
    for key in ("canary", "pending", "log"):
        del state[key]
    path.write_text(json.dumps(state))
    assert registry.canary() is None and registry.pending() == []
    assert registry.transitions() == [] and registry.serving_for("k") == 1
