"""An adapter for ONNX Runtime GenAI without the builder: the base model's file, its adapted
matrices quantised again.

A LoRA adapter changes only the projections it targets. The engine's copy of the base model holds
each of them as one `MatMulNBits` weight (its 8- or 4-bit blocks and their scales), quantised by
ONNX Runtime's own block quantiser from the plain float32 weights. So the merged model's file is
the base model's file with those weights replaced: for each adapted projection, the plain weight
plus the adapter's product (`W + scaling * B @ A`, as peft's `merge_and_unload` computes it in
float32), packed as the builder packs it (q, k and v side by side in one matrix), transposed and
quantised by the same function (`DefaultWeightOnlyQuantizer.qbits_block_quant`). The bytes are
those the builder writes for the merged model; `tests/completion/test_onnx_patch.py` holds the
two to it.

Why not the builder: it builds the whole float graph in memory and quantises a copy of it, so
converting the bundled model peaked at 6.9 GB in its process (and merging at 2.9 GB in the one
that merged), twice what training the adapter needs. Patching reads one projection at a time: its
memory is a layer's matrices (0.33 GB on the bundled model), and it takes seconds (10 s, against
42 s).

Before it replaces anything, every weight it writes is first quantised from the plain weight
alone and compared with the base file's bytes; where the base copy was not made this way (another
quantiser, other weights, an unknown layout), or the adapter is of a kind this does not apply
(`Unpatchable`), the caller merges and converts with the builder instead.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.manifest import MANIFEST
from completion.adapters import CONFIG, WEIGHTS

DATA_FILE = "model.onnx.data"
GRAPH_FILE = "model.onnx"

# The projections LoRA may target, by the plain model's module names, and the engine's matrix
# that holds each: the builder packs q, k and v into one.
_PACKED = {"attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
_SINGLE = {
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.o_proj": "self_attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj",
    "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj",
}
_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


class Unpatchable(Exception):
    """This adapter or base copy cannot be patched; merge and convert with the builder."""


@dataclass(frozen=True)
class _Slot:
    """Where one quantised tensor lies in the data file."""

    offset: int
    length: int


@dataclass(frozen=True)
class _Matrix:
    """One `MatMulNBits` weight of the engine's model and the plain modules it is made of."""

    layer: int
    modules: tuple[str, ...]
    bits: int
    block_size: int
    weight: _Slot
    scales: _Slot


def _dtypes() -> dict[str, Any]:
    import torch

    return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class _PlainWeights:
    """Tensors of a plain model's safetensors files (one, or the shards of one), read one at a
    time (no mapping: the pages of a mapped file would stay resident in this process)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [path.open("rb") for path in paths]
        # name -> (file, where its data begins, its header entry)
        self._entries: dict[str, tuple[Any, int, dict[str, Any]]] = {}
        for file in self._files:
            (size,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(size))
            for name, entry in header.items():
                if name != "__metadata__":
                    self._entries[name] = (file, 8 + size, entry)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of every 2-D weight, by module path (as `adapters.linear_shapes`)."""
        return {
            name.removesuffix(".weight"): (int(entry["shape"][0]), int(entry["shape"][1]))
            for name, (_file, _base, entry) in self._entries.items()
            if name.endswith(".weight") and len(entry.get("shape", ())) == 2
        }

    def get(self, name: str) -> np.ndarray:
        import torch

        if name not in self._entries:
            raise Unpatchable(f"the plain model has no tensor {name}")
        file, base, entry = self._entries[name]
        dtype = _dtypes().get(entry["dtype"])
        if dtype is None:
            raise Unpatchable(f"{name} is {entry['dtype']}, not a float type read here")
        start, end = entry["data_offsets"]
        file.seek(base + start)
        data = torch.frombuffer(bytearray(file.read(end - start)), dtype=dtype)
        return data.reshape(entry["shape"]).to(torch.float32).numpy()

    def close(self) -> None:
        for file in self._files:
            file.close()


def _scaling(config: dict[str, Any]) -> float:
    """The factor peft multiplies `B @ A` by, for a LoRA config this applies to."""
    if config.get("peft_type") != "LORA":
        raise Unpatchable(f"not a LoRA adapter ({config.get('peft_type')})")
    unsupported = [
        name
        for name in ("use_dora", "modules_to_save", "layers_to_transform", "fan_in_fan_out")
        if config.get(name)
    ]
    unsupported += [name for name in ("rank_pattern", "alpha_pattern") if config.get(name)]
    if config.get("bias", "none") != "none":
        unsupported.append("bias")
    if unsupported:
        raise Unpatchable(f"the adapter uses {', '.join(unsupported)}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str) or not set(targets) <= _TARGETS:
        raise Unpatchable(f"the adapter targets {targets}, not only the projections")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _matrices(base: Path) -> list[_Matrix]:
    """The engine model's quantised projection weights, with where their bytes lie."""
    import onnx

    graph = onnx.load(str(base / GRAPH_FILE), load_external_data=False).graph
    slots: dict[str, _Slot] = {}
    for tensor in graph.initializer:
        external = {entry.key: entry.value for entry in tensor.external_data}
        if external.get("location") == DATA_FILE:
            slots[tensor.name] = _Slot(int(external.get("offset", 0)), int(external["length"]))
    found = []
    for node in graph.node:
        if node.op_type != "MatMulNBits" or not node.name.startswith("/model/layers."):
            continue
        parts = node.name.split("/")  # /model/layers.3/attn/qkv_proj/MatMul_Q8
        kind = ".".join(parts[3:5]) if len(parts) == 6 else ""
        modules = _PACKED.get(kind) or ((_SINGLE[kind],) if kind in _SINGLE else None)
        number = parts[2].removeprefix("layers.")
        if modules is None or not number.isdigit():
            raise Unpatchable(f"unknown projection {node.name}")
        layer = int(number)
        if len(node.input) != 3:  # a zero-point input: asymmetric, not what the builder writes
            raise Unpatchable(f"{node.name} has zero points")
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        weight, scales = (slots.get(name) for name in node.input[1:3])
        if weight is None or scales is None:
            raise Unpatchable(f"{node.name}'s weights are not in {DATA_FILE}")
        found.append(
            _Matrix(
                layer,
                tuple(f"model.layers.{layer}.{module}" for module in modules),
                int(attributes["bits"]),
                int(attributes["block_size"]),
                weight,
                scales,
            )
        )
    if not found:
        raise Unpatchable("no quantised projections in the engine's model")
    return found


def _quantise(weight: np.ndarray, bits: int, block_size: int) -> tuple[bytes, bytes]:
    """`weight` ([out, in], as the plain model stores it) as the builder quantises it."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    quantiser = DefaultWeightOnlyQuantizer(
        DefaultWeightOnlyQuantConfig(
            block_size=block_size,
            is_symmetric=True,
            quant_format=QuantFormat.QOperator,
            bits=bits,
        )
    )
    packed, scales, _zero_points = quantiser.qbits_block_quant(np.ascontiguousarray(weight.T))
    return packed.tobytes(), scales.tobytes()


def _read(file: Any, slot: _Slot) -> bytes:
    file.seek(slot.offset)
    data: bytes = file.read(slot.length)
    return data


class _Lora:
    """The adapter's A and B matrices by the plain module they change; `delta(name)` is
    `scaling * B @ A` for that module, made when it is needed (all of them at once would be as
    large as the projections)."""

    def __init__(self, adapter: Path, scaling: float) -> None:
        import torch
        from safetensors import safe_open

        self.scaling = scaling
        self.pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        with safe_open(str(adapter / WEIGHTS), "pt") as weights:
            names = set(weights.keys())
            for name in sorted(names):
                if not name.endswith(".lora_A.weight"):
                    continue
                module = name.removesuffix(".lora_A.weight").removeprefix("base_model.model.")
                b_name = name.replace(".lora_A.", ".lora_B.")
                if b_name not in names:
                    raise Unpatchable(f"the adapter has {name} without {b_name}")
                self.pairs[module] = (
                    weights.get_tensor(name).to(torch.float32),
                    weights.get_tensor(b_name).to(torch.float32),
                )

    def delta(self, module: str) -> np.ndarray:
        a, b = self.pairs[module]
        return ((b @ a) * self.scaling).numpy()


def plain_weights(plain: Path) -> _PlainWeights:
    """The plain model's safetensors files, for reading tensor by tensor."""
    files = sorted(plain.glob("*.safetensors"))
    if not files:
        raise Unpatchable(f"no safetensors files in {plain}")
    return _PlainWeights(files)


def plain_linear_shapes(plain: Path) -> dict[str, tuple[int, int]]:
    """(out, in) of the plain model's 2-D weights, by module path, read off its files' headers."""
    weights = plain_weights(plain)
    try:
        return weights.linear_shapes()
    finally:
        weights.close()


def patch_into(base: Path, plain: Path, adapter: Path, work: Path) -> int:
    """Write into the empty directory `work` the engine's model of `plain` + `adapter`, from the
    engine's model of `plain` at `base`; the number of matrices replaced.

    Raises `Unpatchable` (with `work` emptied again) when the adapter is not a plain LoRA on the
    projections, when the base copy's layout is unknown, or when a weight quantised from `plain`
    alone is not the base copy's byte for byte.
    """
    config = json.loads((adapter / CONFIG).read_text(encoding="utf-8"))
    scaling = _scaling(config)
    lora = _Lora(adapter, scaling)
    matrices = [m for m in _matrices(base) if any(name in lora.pairs for name in m.modules)]
    unused = set(lora.pairs) - {name for m in matrices for name in m.modules}
    if unused:
        raise Unpatchable(f"the engine's model has no matrix for {sorted(unused)[0]}")
    source = plain_weights(plain)
    try:
        for item in base.iterdir():
            if item.is_file() and not item.name.startswith(".") and item.name != MANIFEST:
                shutil.copyfile(item, work / item.name)
        with (work / DATA_FILE).open("r+b") as data:
            for matrix in matrices:
                parts = [source.get(f"{name}.weight") for name in matrix.modules]
                if _quantise(np.concatenate(parts), matrix.bits, matrix.block_size) != (
                    _read(data, matrix.weight),
                    _read(data, matrix.scales),
                ):
                    raise Unpatchable(
                        f"{matrix.modules[0]} quantised here is not the base copy's: the copy was "
                        "made another way"
                    )
                merged = np.concatenate(
                    [
                        part + lora.delta(name) if name in lora.pairs else part
                        for name, part in zip(matrix.modules, parts, strict=True)
                    ]
                )
                for slot, content in zip(
                    (matrix.weight, matrix.scales),
                    _quantise(merged, matrix.bits, matrix.block_size),
                    strict=True,
                ):
                    data.seek(slot.offset)
                    data.write(content)
    except BaseException:
        for item in work.iterdir():
            item.unlink()
        raise
    finally:
        source.close()
    return len(matrices)
