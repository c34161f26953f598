"""Linear layers whose weights are packed once for oneDNN, for the torch runner in bfloat16.

`torch.nn.functional.linear` on a CPU hands each product to oneDNN with the weight in torch's
plain layout, and oneDNN reorders it into its own blocked layout on every call. Packing the
weights once at load (`torch.ops.mkldnn._reorder_linear_weight`) and calling the packed product
(`torch.ops.mkldnn._linear_pointwise`, the pair PyTorch's own compiler uses when it freezes a
model for a CPU) leaves that copy out: on the development machine (Intel Xeon with AMX, one
thread) a one-token product with a 896 x 4864 bfloat16 weight took 0.43 ms against 0.64 ms, and
the bundled model's logits came out the same to the bit. Figures: docs/next-edit.md.

The decoder layers' projections and the output head are packed (the head's 152k rows are the
largest matrix of the bundled model, and a one-token pass reads all of them), unless the head
shares its weight with the token embeddings, which would then be kept twice. The packed weights
take what the plain ones did, and the plain ones are released as they are replaced.

Packing is skipped, with a log line, where this PyTorch has no such operators or they fail or
disagree with `linear` on a probe: the model then runs as loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.memory import release_mapped_file

log = logging.getLogger(__name__)

PROBE_TOLERANCE = 1e-2
"""Largest difference from `linear` the probe accepts (bfloat16 rounding; in practice 0)."""


class PackedLinear(nn.Module):
    """`nn.Linear`'s product with the weight held in oneDNN's layout (no gradient; inference)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.dtype = weight.dtype
        self.packed_bytes = weight.numel() * weight.element_size()
        # Not a parameter or buffer: an opaque oneDNN tensor has no plain storage to save.
        self.packed = _reorder(weight)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def dense_weight(self) -> Any:
        """The weight in torch's plain layout (a copy; for inspection)."""
        return self.packed.to_dense()

    def forward(self, x: Any) -> Any:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def _reorder(weight: Any) -> Any:
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def packing_works(dtype: Any = torch.bfloat16) -> bool:
    """Whether this PyTorch packs and multiplies `dtype` weights as `linear` does (a probe)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        linear = nn.Linear(64, 48, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(48, 64, generator=generator))
            linear.bias.copy_(torch.randn(48, generator=generator))
        x = torch.randn(1, 3, 64, generator=generator).to(dtype)
        with torch.inference_mode():
            expected = linear(x).float()
            found = PackedLinear(linear)(x).float()
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        log.info("linear weights stay unpacked: %s", exc)
        return False
    difference = float((expected - found).abs().max())
    if found.shape != expected.shape or not difference <= PROBE_TOLERANCE:
        log.info("linear weights stay unpacked: the packed product differs by %s", difference)
        return False
    return True


def pack_linears(model: Any, *, mapped: Sequence[Path] = ()) -> int:
    """Replace the decoder layers' `nn.Linear` projections of `model` (a transformers causal LM)
    and its output head with `PackedLinear`s; the number replaced (0 where packing does not work
    here). A head that shares its weight with the token embeddings stays as it is: packing it
    would keep a second copy of the largest matrix.

    The weights are usually read from files mapped into memory (`mapped`: their paths), whose
    pages stay resident once read, and in the mapping as long as one tensor of the file lives
    (the embeddings). So the pages read so far are given back after each layer
    (`common.memory.release_mapped_file`): loading does not hold the plain and the packed weights
    at once, and afterwards only the embedding rows read are resident, as without packing."""
    layers = _layers(model)
    if layers is None:
        return 0
    sample = next(model.parameters(), None)
    if sample is None or not packing_works(sample.dtype):
        return 0
    replaced = 0
    for layer in layers:
        replaced += _replace(_projections(layer))
        _give_back(mapped)
    head = getattr(model, "lm_head", None)
    embeddings = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = head is not None and getattr(embeddings, "weight", None) is head.weight
    if type(head) is nn.Linear and not tied:
        replaced += _replace([("lm_head", model, head)])
        _give_back(mapped)
    return replaced


def _replace(found: list[tuple[str, Any, Any]]) -> int:
    for name, parent, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def _give_back(mapped: Sequence[Path]) -> None:
    for path in mapped:
        release_mapped_file(path)


def _projections(layer: Any) -> list[tuple[str, Any, Any]]:
    """(name, parent, module) of each `nn.Linear` inside a decoder layer."""
    return [
        (name, parent, child)
        for parent in layer.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]


def packed_bytes(model: Any) -> int:
    """Bytes of the packed weights in `model` (they are not among its parameters)."""
    return sum(m.packed_bytes for m in model.modules() if isinstance(m, PackedLinear))


def _layers(model: Any) -> Any:
    inner = getattr(model, "model", None)
    return getattr(inner, "layers", None)
