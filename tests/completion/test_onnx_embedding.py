"""The 8-bit token embedding of ONNX models (`completion.runners.onnx_embedding`): the blocks'
arithmetic, the rewritten graph as ONNX Runtime computes it, and the weights file around it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from completion.runners.onnx_embedding import (
    block_for,
    dequantize_rows,
    quantize_embedding,
    quantize_rows,
)

VOCAB, HIDDEN = 300, 96
BLOCK = 32  # the largest block size that divides HIDDEN


def test_the_largest_block_that_divides_a_row_is_used() -> None:
    assert block_for(896) == 128  # the bundled model: 7 blocks of 128
    assert block_for(HIDDEN) == BLOCK
    assert block_for(40) is None


def test_rows_come_back_within_half_a_step_of_each_block() -> None:
    rows = np.random.default_rng(0).normal(0, 0.05, (VOCAB, HIDDEN)).astype(np.float32)
    rows[3] = 0.0  # a row of zeros has no scale to divide by
    rows[4, :BLOCK] = 7.5  # one block far larger than the rest of its row
    quantized, scales = quantize_rows(rows, BLOCK)
    assert quantized.dtype == np.uint8 and quantized.shape == rows.shape
    assert scales.shape == (VOCAB, HIDDEN // BLOCK)
    back = dequantize_rows(quantized, scales)
    step = np.repeat(scales, BLOCK, axis=1)
    assert np.all(np.abs(back - rows) <= step / 2 + 1e-7)
    assert np.all(back[3] == 0.0)
    assert np.allclose(back[4, :BLOCK], 7.5)
    assert np.abs(back[4, BLOCK:] - rows[4, BLOCK:]).max() < 0.05 / 20  # its own scale


def _external_model(folder: Path, table: np.ndarray, bias: np.ndarray) -> None:
    """ids -> Gather(table) + bias, every initializer in `model.onnx.data`."""
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["embed.weight", "input_ids"], ["embedded"], name="embed"),
            helper.make_node("Add", ["embedded", "bias"], ["out"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, HIDDEN])],
        [numpy_helper.from_array(table, "embed.weight"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save_model(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )


def _run(folder: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["out"], {"input_ids": ids})[0]


def test_rewritten_graph_computes_the_dequantized_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    table = rng.normal(0, 0.05, (VOCAB, HIDDEN)).astype(np.float32)
    bias = rng.normal(0, 1, HIDDEN).astype(np.float32)
    _external_model(tmp_path, table, bias)
    ids = np.array([0, 7, 299, 7, 150], dtype=np.int64)
    before = _run(tmp_path, ids)
    size_before = (tmp_path / "model.onnx.data").stat().st_size

    assert quantize_embedding(tmp_path) is True
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert [node.op_type for node in model.graph.node] == ["GatherBlockQuantized", "Add"]
    assert "embed.weight" not in {tensor.name for tensor in model.graph.initializer}
    # The float32 table is gone from the file: a quarter of its bytes and the scales remain.
    assert (tmp_path / "model.onnx.data").stat().st_size < size_before / 2

    after = _run(tmp_path, ids)
    quantized, scales = quantize_rows(table, BLOCK)
    expected = dequantize_rows(quantized, scales)[ids] + bias
    np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-7)  # zero point, axes, blocks
    step = np.repeat(scales[ids], BLOCK, axis=1)
    assert np.all(np.abs(after - before) <= step / 2 + 1e-6)
    # The other weights were carried over byte for byte.
    reloaded = onnx.load(str(tmp_path / "model.onnx"))
    bias_after = next(t for t in reloaded.graph.initializer if t.name == "bias")
    assert np.array_equal(numpy_helper.to_array(bias_after), bias)

    assert quantize_embedding(tmp_path) is False  # nothing float32 left to rewrite


def test_a_table_read_elsewhere_too_is_left_alone(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    table = rng.normal(0, 0.05, (VOCAB, HIDDEN)).astype(np.float32)
    _external_model(tmp_path, table, np.zeros(HIDDEN, dtype=np.float32))
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    # A tied output layer reading the same table: rewriting it would change that layer as well.
    model.graph.node.append(helper.make_node("Transpose", ["embed.weight"], ["tied"]))
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    data = (tmp_path / "model.onnx.data").read_bytes()
    assert quantize_embedding(tmp_path) is False
    assert (tmp_path / "model.onnx.data").read_bytes() == data


def test_rows_that_do_not_split_into_blocks_are_left_alone(tmp_path: Path) -> None:
    hidden = 40  # no block size divides it
    table = np.ones((VOCAB, hidden), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed.weight", "input_ids"], ["out"])],
        "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, hidden])],
        [numpy_helper.from_array(table, "embed.weight")],
    )
    onnx.save_model(
        helper.make_model(graph),
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    assert quantize_embedding(tmp_path) is False
