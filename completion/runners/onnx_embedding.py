"""The token embedding of an 8-bit ONNX model in 8 bits too.

The engine's builder quantises every matrix multiplication of an 8-bit model but leaves the token
embedding table in float32 (its `GatherBlockQuantized` export is 4-bit only): 544 MB of the bundled
model's 1.1 GB file. The runtime maps that table from the file, and the pages of every row a
session has read stay resident, with the cached pages around them: 77 MB after the typing
benchmark, and up to 410 MB for a freshly converted copy (all of it in the page cache) after 137
prompts (docs/models.md).

`quantize_embedding` rewrites the converted model once, after the builder: the table becomes
uint8 in blocks of 128 along each row with one float32 scale per block (symmetric, zero point 128:
what the runtime assumes when none is given, and the scheme of the builder's 8-bit matrices), read
by the runtime's `GatherBlockQuantized` (`bits` 8, ONNX Runtime 1.22 and later), and the weights
file is written again without the float32 table. Each value is within half a block's step of the
float32 one (the step is the block's largest magnitude / 127). The file is rewritten by streaming
it, so this needs about 60 MB of memory whatever the model's size.

Why blocks of 128, where the matrices have 32: the runtime maps the table and its scales from the
file, and at each first read of a page the kernel maps the cached pages around it too (64 KB), so
a session's resident share of both tensors grows with every new token until all of them is
resident. With blocks of 128 the scales are 4.3 MB (17 MB with 32) and all of it is 140 MB, where
the float32 table was 544 MB. The error grows from 0.52% to 0.66% of the table's RMS (bundled
model); greedy outputs were as often the float32 table's with either (docs/models.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# Block sizes tried, largest first: the first that divides a row is used.
BLOCKS = (128, 64, 32, 16)
ZERO_POINT = 128  # uint8 with no zero points: the runtime's default for 8 bits
_ROWS_PER_CHUNK = 8192
_COPY_CHUNK = 1 << 24
# Large tensors start on a boundary the runtime can map without copying.
_ALIGN = 1 << 16
_ALIGN_ABOVE = 1 << 20


def _external(tensor: Any) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _set_external(tensor: Any, location: str, offset: int, length: int) -> None:
    import onnx

    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _float_table(model: Any) -> tuple[int, Any] | None:
    """The index of the token embedding's Gather node and its float32 [vocab, hidden] table, if
    the graph has one kept in the external file, read by that node alone, with rows that split
    into whole blocks."""
    import onnx

    inputs = {value.name for value in model.graph.input}
    tables = {tensor.name: tensor for tensor in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for index, node in enumerate(model.graph.node):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            continue
        table = tables.get(node.input[0])
        if (
            table is not None
            and readers[table.name] == 1
            and node.input[1] in inputs
            and table.data_type == onnx.TensorProto.FLOAT
            and len(table.dims) == 2
            and block_for(table.dims[1]) is not None
            and table.data_location == onnx.TensorProto.EXTERNAL
            and all(attribute.i == 0 for attribute in node.attribute if attribute.name == "axis")
        ):
            return index, table
    return None


def block_for(hidden: int) -> int | None:
    """The block size for rows of `hidden` values (None: no block size divides them)."""
    return next((block for block in BLOCKS if hidden % block == 0), None)


def quantize_rows(rows: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 rows [n, hidden] as uint8 [n, hidden] and float32 scales [n, hidden / block]."""
    blocks = rows.reshape(rows.shape[0], -1, block)
    scales = np.abs(blocks).max(axis=2) / 127.0
    safe = np.where(scales > 0, scales, 1.0)[:, :, None]
    quantized = np.clip(np.rint(blocks / safe), -127, 127) + ZERO_POINT
    return quantized.astype(np.uint8).reshape(rows.shape), scales.astype(np.float32)


def dequantize_rows(quantized: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float32 rows `quantize_rows` stands for (what `GatherBlockQuantized` computes)."""
    block = quantized.shape[1] // scales.shape[1]
    blocks = quantized.reshape(quantized.shape[0], -1, block).astype(np.float32) - ZERO_POINT
    return (blocks * scales[:, :, None]).reshape(quantized.shape)


def _pad(out: BinaryIO, size: int) -> int:
    """Move `out` to where a tensor of `size` bytes starts; its offset."""
    offset = out.tell()
    if size >= _ALIGN_ABOVE and offset % _ALIGN:
        out.write(b"\0" * (_ALIGN - offset % _ALIGN))
    return out.tell()


def _copy(source: BinaryIO, out: BinaryIO, offset: int, length: int) -> None:
    source.seek(offset)
    left = length
    while left:
        chunk = source.read(min(left, _COPY_CHUNK))
        if not chunk:
            raise ValueError("the weights file is shorter than its model says")
        out.write(chunk)
        left -= len(chunk)


def quantize_embedding(model_dir: Path) -> bool:
    """Rewrite the ONNX model in `model_dir` with its token embedding in 8 bits.

    False (nothing written) when the model has no float32 embedding table in its external
    weights file (a 4-bit model's is quantised by the builder already). It runs on the
    conversion's temporary directory (`conversion.convert_once`), before the manifest is written:
    a process killed on the way leaves nothing that is loaded.
    """
    import onnx
    from onnx import helper

    graph_path = model_dir / "model.onnx"
    model = onnx.load(str(graph_path), load_external_data=False)
    found = _float_table(model)
    if found is None:
        return False
    at, table = found
    node = model.graph.node[at]
    vocab, hidden = (int(size) for size in table.dims)
    block = block_for(hidden) or BLOCKS[-1]  # `_float_table` found one
    location = _external(table)["location"]
    data_path = model_dir / location
    staged = data_path.with_name(data_path.name + ".staged")
    quantized_name, scales_name = f"{table.name}_Q8", f"{table.name}_scales"
    with data_path.open("rb") as source, staged.open("wb") as out:
        for tensor in model.graph.initializer:
            if tensor.name == table.name or tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = _external(tensor)
            length = int(where["length"])
            offset = _pad(out, length)
            _copy(source, out, int(where.get("offset", 0)), length)
            _set_external(tensor, location, offset, length)
        start = int(_external(table).get("offset", 0))
        row_bytes = hidden * 4
        quantized_offset = _pad(out, vocab * hidden)
        scales = np.empty((vocab, hidden // block), dtype=np.float32)
        for first in range(0, vocab, _ROWS_PER_CHUNK):
            count = min(_ROWS_PER_CHUNK, vocab - first)
            source.seek(start + first * row_bytes)
            rows = np.frombuffer(source.read(count * row_bytes), dtype="<f4")
            if rows.size != count * hidden:
                raise ValueError("the weights file is shorter than its model says")
            quantized, scales[first : first + count] = quantize_rows(
                rows.reshape(count, hidden), block
            )
            out.write(quantized.tobytes())
        scales_offset = _pad(out, scales.nbytes)
        out.write(scales.astype("<f4").tobytes())
        out.flush()
        os.fsync(out.fileno())

    quantized_tensor = onnx.TensorProto(
        name=quantized_name, data_type=onnx.TensorProto.UINT8, dims=[vocab, hidden]
    )
    _set_external(quantized_tensor, location, quantized_offset, vocab * hidden)
    scales_tensor = onnx.TensorProto(
        name=scales_name, data_type=onnx.TensorProto.FLOAT, dims=[vocab, hidden // block]
    )
    _set_external(scales_tensor, location, scales_offset, scales.nbytes)
    initializers = [tensor for tensor in model.graph.initializer if tensor.name != table.name]
    del model.graph.initializer[:]
    model.graph.initializer.extend([*initializers, quantized_tensor, scales_tensor])
    gather = helper.make_node(
        "GatherBlockQuantized",
        [quantized_name, node.input[1], scales_name],
        list(node.output),
        name=node.name + "_Q8",
        domain="com.microsoft",
        bits=8,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )
    nodes = list(model.graph.node)
    nodes[at] = gather
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(entry.domain == "com.microsoft" for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    os.replace(staged, data_path)
    staged_graph = graph_path.with_name(graph_path.name + ".staged")
    staged_graph.write_bytes(model.SerializeToString())
    os.replace(staged_graph, graph_path)
    return True
