"""The policy client follows the settings; the per-request read builds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion.gate import builtin_policy
from lsp_server.config import Settings
from lsp_server.features.policy import PolicyFeature


def settings(tmp_path: Path, **policy: float) -> Settings:
    return Settings.model_validate({"cacheDir": str(tmp_path), "policy": policy})


@pytest.fixture
def feature() -> PolicyFeature:
    return PolicyFeature()


def test_current_is_the_builtin_policy_before_a_client_exists(feature: PolicyFeature) -> None:
    assert feature.client is None
    assert feature.current().version == builtin_policy().version


def test_same_settings_keep_the_client(feature: PolicyFeature, tmp_path: Path) -> None:
    first = feature.follow(settings(tmp_path, showFloor=1.0))
    assert feature.follow(settings(tmp_path, showFloor=1.0)) is first
    assert feature.current() is first.current()
    feature.close()


def test_changed_settings_replace_and_close_the_client(
    feature: PolicyFeature, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = feature.follow(settings(tmp_path, showFloor=1.0))
    closed: list[object] = []
    monkeypatch.setattr(first, "close", lambda: closed.append(first))
    second = feature.follow(settings(tmp_path, showFloor=0.0))
    assert second is not first and feature.client is second
    assert closed == [first]
    assert feature.current().show_floor == 0.0
    feature.close()
    assert feature.client is None


def test_current_takes_no_lock_and_builds_nothing(feature: PolicyFeature, tmp_path: Path) -> None:
    client = feature.follow(settings(tmp_path))
    # Held by a settings change in progress: the request path must not wait for it.
    with feature._lock:
        assert feature.current() is client.current()
    feature.close()
