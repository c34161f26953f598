"""What machine a measurement ran on, for benchmark reports: the CPU's model name, its cores,
and the vector instructions that set int8 and float32 speed (a CPU with AVX-512 VNNI runs the
default engine's int8 arithmetic several times faster than one with AVX2 alone)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

_WANTED = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
)
# Flags of a CPU that multiplies bfloat16 matrices natively.
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
# Set to 0 or 1 to decide `native_bfloat16` whatever the CPU (the tests set 0: the same
# numbers on any CPU).
BFLOAT16_VARIABLE = "TABLOOP_NATIVE_BFLOAT16"


def cpu_description() -> dict[str, Any]:
    """`{"model", "cores", "flags"}` read from /proc/cpuinfo (empty where it is not there)."""
    model, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and not model:
                model = value.strip()
            elif name.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in _WANTED if f in flags]}


def native_bfloat16(flags: Collection[str] | None = None) -> bool:
    """Whether a CPU with `flags` multiplies bfloat16 matrices natively (AVX-512 BF16 or AMX);
    without `flags`, this CPU, unless `$TABLOOP_NATIVE_BFLOAT16` says otherwise. Where it does,
    training in bfloat16 is 2.6 times as fast as in float32 and holds half the memory; where it
    does not, it is 3.4 times slower (`tabloop bench train`, docs/learning.md), and next edits
    get a bfloat16 runner of their own (docs/next-edit.md)."""
    if flags is None:
        forced = os.environ.get(BFLOAT16_VARIABLE, "").strip()
        if forced in ("0", "1"):
            return forced == "1"
        flags = cpu_description()["flags"]
    return any(flag in flags for flag in BFLOAT16_FLAGS)
