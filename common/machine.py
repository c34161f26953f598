"""What machine a measurement ran on, for benchmark reports: the CPU's model name, its cores,
and the vector instructions that set int8 and float32 speed (a CPU with AVX-512 VNNI runs the
default engine's int8 arithmetic several times faster than one with AVX2 alone)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_WANTED = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


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
