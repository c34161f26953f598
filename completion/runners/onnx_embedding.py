"""The token embedding of an 8-bit ONNX Runtime GenAI model, quantized to 8 bits after the build.

The engine's builder quantizes the token embedding to 4 bits only; asked for 8 bits, it keeps the
embedding as a float32 `Gather` table. For the bundled 0.5B model that table is 519 MB, half of
the whole model and most of the server's memory. ONNX Runtime's `GatherBlockQuantized` reads
8-bit blocks as well (`bits=8`, unsigned bytes with zero point 128), so after the build this
step quantizes the table the way `MatMulNBits` stores 8-bit weights (blocks of 32 values along
the hidden axis, symmetric, one float scale per block) and swaps the `Gather` for a
`GatherBlockQuantized` over it: 136 MB of bytes and 17 MB of scales for that model.

It runs in a child process of the build (`python -m completion.runners.onnx_embedding DIR`): it
holds the whole model in memory for a moment.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 32
ZERO_POINT = 128
DATA_FILE = "model.onnx.data"
QUANTIZED_SUFFIX = "_Q8"
SCALES_SUFFIX = "_scales"


def quantize_rows(table: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """`table` (rows × width, float) as unsigned bytes (value + 128) and one scale per block of
    `block` values along each row: row r, value j is `(q[r, j] - 128) * scales[r, j // block]`."""
    rows, width = table.shape
    if width % block:
        raise ValueError(f"a row of {width} values does not split into blocks of {block}")
    blocks = table.astype(np.float32, copy=False).reshape(rows, width // block, block)
    scales = np.abs(blocks).max(axis=-1) / 127.0
    safe = np.where(scales > 0, scales, 1.0)
    quantized = np.rint(blocks / safe[..., None])
    np.clip(quantized, -127, 127, out=quantized)
    quantized += ZERO_POINT
    return quantized.astype(np.uint8).reshape(rows, width), scales.astype(np.float32)


def _embedding_gather(graph: Any) -> tuple[Any, Any] | None:
    """The `Gather` of the token ids from a float table whose rows split into blocks, and the
    table's initializer; or None."""
    import onnx

    tables = {item.name: item for item in graph.initializer}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) != 2 or node.input[1] != "input_ids":
            continue
        table = tables.get(node.input[0])
        if (
            table is not None
            and table.data_type == onnx.TensorProto.FLOAT
            and len(table.dims) == 2
            and table.dims[1] % BLOCK == 0
        ):
            return node, table
    return None


def quantize_embedding(model_dir: Path) -> bool:
    """Replace the float32 embedding table of the model in `model_dir` with 8-bit blocks; False
    when there is none to replace (a 4-bit build already has `GatherBlockQuantized`; a hidden
    size that is no multiple of 32 keeps its float table).

    `model.onnx` and its weights file are written next to the old ones and renamed over them.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=True)
    found = _embedding_gather(model.graph)
    if found is None:
        return False
    gather, table = found
    quantized, scales = quantize_rows(numpy_helper.to_array(table))
    data_name = table.name + QUANTIZED_SUFFIX
    scales_name = table.name + SCALES_SUFFIX
    graph = model.graph
    graph.initializer.remove(table)
    graph.initializer.extend(
        [
            numpy_helper.from_array(quantized, data_name),
            numpy_helper.from_array(scales, scales_name),
        ]
    )
    replacement = helper.make_node(
        "GatherBlockQuantized",
        [data_name, gather.input[1], scales_name],
        list(gather.output),
        name=gather.name + QUANTIZED_SUFFIX,
        domain="com.microsoft",
        bits=8,
        block_size=BLOCK,
        gather_axis=0,
        quantize_axis=1,
    )
    position = list(graph.node).index(gather)
    graph.node.remove(gather)
    graph.node.insert(position, replacement)
    if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    staging = Path(tempfile.mkdtemp(prefix=".embedding.", dir=model_dir))
    try:
        onnx.save_model(
            model,
            str(staging / "model.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=DATA_FILE,
        )
        for name in (DATA_FILE, "model.onnx"):
            (staging / name).chmod(0o644)
            os.replace(staging / name, model_dir / name)
    finally:
        for item in staging.iterdir() if staging.exists() else ():
            item.unlink()
        if staging.exists():
            staging.rmdir()
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m completion.runners.onnx_embedding MODEL_DIR", file=sys.stderr)
        return 2
    replaced = quantize_embedding(Path(argv[0]))
    print("embedding quantized to 8 bits" if replaced else "no float32 embedding table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
