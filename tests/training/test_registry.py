from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from completion.adapters import WEIGHTS, save_adapter
from completion.runners.loading import load_model, resolve_source
from training.lora import LoraShape, attach_lora
from training.registry import (
    DEFAULT_MARGIN,
    AdapterRegistry,
    AdapterRegistryError,
    promotion_decision,
    scope_dir,
)


@pytest.fixture(scope="module")
def adapter_dir(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    cache = tmp_path_factory.mktemp("cache")
    source = resolve_source(str(tiny_model_path), cache)
    _tokenizer, model = load_model(source, "float32", cache)
    base_id = f"{source.name}@{source.revision}"
    target = tmp_path_factory.mktemp("adapter") / "a"
    save_adapter(attach_lora(model, LoraShape(rank=2, alpha=4)), target, base_id, {})
    return target, base_id


def _gain(against: int | None, low: float, similarity: float = 0.0) -> dict[str, Any]:
    """An evaluation whose exact-line gain has the 95% lower bound `low`, and whose edit
    similarity's gain is `similarity` (its interval 0.05 either side)."""
    return {
        "against": against,
        "exact_line_difference": {"mean": low + 0.1, "ci95_low": low},
        "edit_similarity_difference": {
            "mean": similarity,
            "ci95_low": similarity - 0.05,
            "ci95_high": similarity + 0.05,
        },
    }


def _paired(
    name: str, mean: float, high: float | None = None, low: float | None = None
) -> dict[str, Any]:
    return {
        name: {
            "mean": mean,
            "ci95_low": mean - 0.05 if low is None else low,
            "ci95_high": mean + 0.05 if high is None else high,
        }
    }


@pytest.mark.parametrize(
    ("evaluation", "allowed"),
    [
        pytest.param(_gain(None, 0.02), True, id="gain"),
        pytest.param(_gain(None, 0.0), False, id="lower-bound-at-zero"),
        pytest.param(_gain(None, -0.02), False, id="worse"),
        pytest.param(_gain(None, 0.02, similarity=-0.06), False, id="similarity-clearly-lower"),
        pytest.param(_gain(None, 0.02, similarity=-0.04), True, id="similarity-not-clearly-lower"),
        pytest.param({}, False, id="no-evaluation"),
        pytest.param(
            {**_gain(None, 0.02), "kept_text": _paired("edit_similarity_difference", -0.1)},
            False,
            id="kept-text-clearly-worse",
        ),
        pytest.param(
            {**_gain(None, 0.02), "kept_text": _paired("edit_similarity_difference", -0.1, 0.05)},
            True,
            id="kept-text-not-clearly-worse",
        ),
        pytest.param(
            {**_gain(None, 0.02), "ignored_reproduced": _paired("difference", 0.2, low=0.05)},
            False,
            id="ignored-written-again-more-often",
        ),
        pytest.param(
            {**_gain(None, 0.02), "ignored_reproduced": _paired("difference", -0.2, low=-0.3)},
            True,
            id="ignored-written-again-less-often",
        ),
        pytest.param(
            {**_gain(None, 0.02), "next_edits": _paired("exact_window_difference", -0.05)},
            False,
            id="next-edits-matched-less-often",
        ),
        pytest.param(
            {**_gain(None, 0.02), "next_edits": _paired("exact_window_difference", 0.0)},
            True,
            id="next-edits-as-often",
        ),
    ],
)
def test_promotion_rule(evaluation: dict[str, Any], allowed: bool) -> None:
    assert promotion_decision(evaluation, DEFAULT_MARGIN)[0] is allowed


def test_the_margin_raises_the_bar_and_a_negative_one_still_needs_a_gain() -> None:
    assert not promotion_decision(_gain(None, 0.01), 0.02)[0]
    assert promotion_decision(_gain(None, 0.03), 0.02)[0]
    assert not promotion_decision(_gain(None, -0.001), -0.01)[0]
    assert promotion_decision(_gain(None, 0.001), -0.01)[0]


def test_versions_promote_and_roll_back(tmp_path: Path, adapter_dir: tuple[Path, str]) -> None:
    adapter, base_id = adapter_dir
    registry = AdapterRegistry(scope_dir(tmp_path, workspace=tmp_path / "ws"))
    first = registry.add(adapter, base_id, {"samples": 8})
    second = registry.add(adapter, base_id, {"samples": 16})
    assert [v.name for v in registry.versions()] == ["v0001", "v0002"]
    assert registry.serving() is None and registry.serving_path() is None

    with pytest.raises(AdapterRegistryError, match="not been evaluated"):
        registry.promote(first.version)
    registry.record_evaluation(first.version, _gain(None, -0.01))
    with pytest.raises(AdapterRegistryError, match="not promoting"):
        registry.promote(first.version)
    assert registry.get(first.version).status == "rejected"

    registry.record_evaluation(first.version, _gain(None, 0.03))
    registry.promote(first.version)
    assert registry.serving() == 1 and registry.serving_path() == registry.root / "v0001"

    registry.record_evaluation(second.version, _gain(None, 0.03))  # against the base: stale
    with pytest.raises(AdapterRegistryError, match="evaluate it again"):
        registry.promote(second.version)
    registry.record_evaluation(second.version, _gain(1, 0.03))
    registry.promote(second.version)
    assert registry.serving() == 2
    assert registry.get(1).status == "retired"

    assert registry.rollback() == 1
    assert registry.serving() == 1 and registry.get(1).status == "serving"
    assert registry.rollback() is None
    with pytest.raises(AdapterRegistryError, match="nothing to roll back"):
        registry.rollback()
    # The state is on disk: a new registry object sees it.
    assert AdapterRegistry(registry.root).serving() is None


def test_a_damaged_adapter_is_refused(tmp_path: Path, adapter_dir: tuple[Path, str]) -> None:
    adapter, base_id = adapter_dir
    registry = AdapterRegistry(tmp_path / "reg")
    with pytest.raises(AdapterRegistryError, match="trained on"):
        registry.add(adapter, "another-model@123", {})
    record = registry.add(adapter, base_id, {})
    weights = registry.root / record.name / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterRegistryError, match="damaged adapter"):
        registry.promote(record.version, force=True)
    assert registry.serving() is None


def test_tenant_scopes_are_checked(tmp_path: Path) -> None:
    assert scope_dir(tmp_path, tenant="team-a").name == "tenant-team-a"
    with pytest.raises(ValueError):
        scope_dir(tmp_path, tenant="../etc")
    with pytest.raises(ValueError):
        scope_dir(tmp_path)


@pytest.mark.parametrize(
    "window",
    [
        pytest.param("v1", id="not-an-object"),
        pytest.param({"trained_through": "12"}, id="mark-not-a-pair"),
        pytest.param({"trained_through": [1.5, 2.5]}, id="row-not-whole"),
        pytest.param({"since": [1.5]}, id="since-too-short"),
    ],
)
def test_a_version_with_a_malformed_window_is_refused(tmp_path: Path, window: Any) -> None:
    version = {"version": 1, "created": 1.0, "base_model": "m@1", "status": "candidate"}
    state = {"versions": [{**version, "train": {"window": window}}], "serving": None}
    (tmp_path / "registry.json").write_text(json.dumps(state))
    with pytest.raises(AdapterRegistryError, match="window"):
        AdapterRegistry(tmp_path).versions()
    good = {"window": {"since": None, "trained_through": [1.5, 2]}}
    state["versions"] = [{**version, "train": good}]
    (tmp_path / "registry.json").write_text(json.dumps(state))
    assert AdapterRegistry(tmp_path).versions()[0].train == good
