"""What the machine can do, as the code that chooses by it reads it."""

from __future__ import annotations

import pytest

from common import machine
from common.machine import BFLOAT16_VARIABLE, native_bfloat16
from training.trainer import TrainSettings


def test_native_bfloat16_follows_the_cpu_flags_unless_overridden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BFLOAT16_VARIABLE, raising=False)
    described = {"model": "x", "cores": 2, "flags": ["avx2", "avx512_bf16"]}
    monkeypatch.setattr(machine, "cpu_description", lambda: described)
    assert native_bfloat16()
    monkeypatch.setattr(machine, "cpu_description", lambda: {**described, "flags": ["avx2"]})
    assert not native_bfloat16()
    monkeypatch.setenv(BFLOAT16_VARIABLE, "1")
    assert native_bfloat16()
    monkeypatch.setenv(BFLOAT16_VARIABLE, "0")
    assert not native_bfloat16()
    # Another CPU's flags are judged as they are, whatever this machine or the override says.
    assert native_bfloat16(["avx2", "amx_bf16"]) and not native_bfloat16(["avx2", "avx512_vnni"])


def test_training_precision_is_decided_when_the_settings_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BFLOAT16_VARIABLE, "1")
    native = TrainSettings()
    assert (native.base_dtype, native.autocast, native.low_precision) == ("bfloat16", True, True)
    # What was decided is what a checkpoint records: resuming elsewhere does not change it.
    assert '"base_dtype": "bfloat16"' in native.identity()
    monkeypatch.setenv(BFLOAT16_VARIABLE, "0")
    plain = TrainSettings()
    assert (plain.base_dtype, plain.autocast, plain.low_precision) == ("float32", False, False)
    assert TrainSettings(base_dtype="bfloat16", autocast=False).weights_dtype == "bfloat16"
    # Asked for explicitly, it stays whatever the CPU.
    monkeypatch.setenv(BFLOAT16_VARIABLE, "1")
    assert TrainSettings(base_dtype="float32", autocast=False).low_precision is False


def test_the_override_is_not_read_as_a_setting() -> None:
    from common.config import env_layer

    assert env_layer({BFLOAT16_VARIABLE: "1"}) is None
