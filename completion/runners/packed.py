"""Linear layers whose weights are packed once for oneDNN, for the torch runner in bfloat16.

`torch.nn.functional.linear` on a CPU hands each product to oneDNN with the weight in torch's
plain layout, and oneDNN reorders it into its blocked layout on every call: for a one-token pass
that copy is most of the work, since the product itself only reads the weight once. Packing the
weights once at load (`torch.ops.mkldnn._reorder_linear_weight`) and calling the packed product
(`torch.ops.mkldnn._linear_pointwise`, the pair PyTorch's own compiler uses when it freezes a
model for a CPU) computes the same numbers without the copy. Measured on the bundled model in
bfloat16 on the development machine (Intel Xeon with AMX), see docs/next-edit.md.

Memory: the packed weights take what the plain ones did, and the plain ones are released (with
the file mapping they were read from). Only the decoder layers' projections are packed by
default. The output head shares its weight
with the token embeddings (the bundled model ties them), so packing it keeps a second copy of
the largest matrix (272 MB for the bundled model); `head=True` does that.

Packing is skipped, with a log line, where this PyTorch has no such operators or they fail or
disagree with `linear` on a probe: the model then runs as loaded.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

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


def pack_linears(model: Any, *, head: bool = False) -> int:
    """Replace the decoder layers' `nn.Linear` projections of `model` (a transformers causal LM)
    with `PackedLinear`s, and its output head too with `head`; the number replaced (0 where
    packing does not work here). The original weights are released as each is replaced."""
    layers = _layers(model)
    if layers is None:
        return 0
    sample = next(model.parameters(), None)
    if sample is None or not packing_works(sample.dtype):
        return 0
    targets = [
        (parent, name, child)
        for layer in layers
        for parent in layer.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    output = getattr(model, "lm_head", None)
    if head and type(output) is nn.Linear:
        targets.append((model, "lm_head", output))
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    # The weights were read from a file mapped into memory, and every tensor of a file shares its
    # mapping: while one of them lives (the embeddings), the replaced weights' pages stay in this
    # process's resident set. The rest are copied out so the mapping can go.
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            tensor.data = tensor.data.clone()
    return len(targets)


def packed_bytes(model: Any) -> int:
    """Bytes of the packed weights in `model` (they are not among its parameters)."""
    return sum(m.packed_bytes for m in model.modules() if isinstance(m, PackedLinear))


def _layers(model: Any) -> Any:
    inner = getattr(model, "model", None)
    return getattr(inner, "layers", None)
