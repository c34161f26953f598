"""The 8-bit embedding of an ONNX Runtime GenAI build: the quantization, the swapped graph as the
engine runs it, and the layout a cached build must have."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from completion.runners import onnx_build
from completion.runners.conversion import MANIFEST, ensure_converted, verify
from completion.runners.loading import resolve_source
from completion.runners.onnx_build import LAYOUT
from completion.runners.onnx_embedding import BLOCK, quantize_embedding, quantize_rows


def table(rows: int = 40, width: int = 64) -> np.ndarray:
    values = np.random.default_rng(7).standard_normal((rows, width)).astype(np.float32)
    values[3] = 0.0  # a row of zeros: scale 0, must not divide by it
    return values


def test_quantized_rows_come_back_within_half_a_step() -> None:
    values = table()
    quantized, scales = quantize_rows(values)
    assert quantized.dtype == np.uint8 and quantized.shape == values.shape
    assert scales.shape == (40, 64 // BLOCK)
    steps = np.repeat(scales, BLOCK, axis=1)
    restored = (quantized.astype(np.float32) - 128) * steps
    assert np.all(np.abs(restored - values) <= steps / 2 + 1e-6)
    assert np.all(restored[3] == 0.0)
    # Each block's largest value is exact: the scale is set by it.
    assert np.allclose(np.abs(restored).max(axis=1), np.abs(values).max(axis=1))


def test_rows_that_do_not_split_into_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="blocks of 32"):
        quantize_rows(np.zeros((2, 48), dtype=np.float32))


def embedding_model(directory: Path, values: np.ndarray) -> None:
    """A graph that embeds `input_ids` the way the builder's 8-bit output does."""
    gather = helper.make_node("Gather", ["embed.weight", "input_ids"], ["hidden"], name="embed")
    double = helper.make_node("Add", ["hidden", "hidden"], ["out"], name="double")
    graph = helper.make_graph(
        [gather, double],
        "embedding",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(values, "embed.weight")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(
        model,
        str(directory / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )


def run(directory: Path, ids: list[int]) -> np.ndarray:
    session = ort.InferenceSession(
        str(directory / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return np.asarray(session.run(None, {"input_ids": np.array(ids, dtype=np.int64)})[0])


def test_the_swapped_graph_embeds_as_the_float_table_did(tmp_path: Path) -> None:
    values = table()
    embedding_model(tmp_path, values)
    before = run(tmp_path, [1, 3, 39])
    size_before = (tmp_path / "model.onnx.data").stat().st_size

    assert quantize_embedding(tmp_path) is True
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    (node,) = [n for n in model.graph.node if n.op_type.startswith("Gather")]
    assert node.op_type == "GatherBlockQuantized" and node.domain == "com.microsoft"
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["bits"] == 8
    assert "embed.weight" not in {item.name for item in model.graph.initializer}
    assert (tmp_path / "model.onnx.data").stat().st_size < size_before / 3
    assert not [item for item in tmp_path.iterdir() if item.name.startswith(".")]

    after = run(tmp_path, [1, 3, 39])
    steps = np.repeat(quantize_rows(values)[1][[1, 3, 39]], BLOCK, axis=1)
    assert np.all(np.abs(after - before) <= 2 * (steps / 2) + 1e-6)  # doubled by the Add
    assert quantize_embedding(tmp_path) is False  # nothing left to replace


def test_an_older_layout_is_brought_up_to_date_in_place(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = resolve_source(str(tiny_model_path), tmp_path)
    with monkeypatch.context() as patched:  # a build as an older tabloop made it
        patched.setattr(onnx_build, "quantize_embedding_in_child", lambda _directory: None)
        target = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    manifest = json.loads((target / MANIFEST).read_text())
    del manifest["layout"]
    (target / MANIFEST).write_text(json.dumps(manifest))
    assert verify(target) == f"built in layout 1, not {LAYOUT} (an older tabloop)"
    assert gathers(target) == {"Gather"}

    def no_build(*_args: object) -> None:
        raise AssertionError("built again instead of brought up to date")

    monkeypatch.setattr(onnx_build, "build_into", no_build)
    again = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    assert again == target and verify(target) is None
    assert json.loads((target / MANIFEST).read_text())["layout"] == LAYOUT
    assert gathers(target) == {"GatherBlockQuantized"}
    assert (target / "model.onnx.data").stat().st_mode & 0o777 == 0o644


def test_a_damaged_old_layout_is_built_again(tiny_model_path: Path, tmp_path: Path) -> None:
    source = resolve_source(str(tiny_model_path), tmp_path)
    target = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    manifest = json.loads((target / MANIFEST).read_text())
    del manifest["layout"]
    manifest["files"]["model.onnx"]["sha256"] = "0" * 64
    (target / MANIFEST).write_text(json.dumps(manifest))
    rebuilt = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    assert verify(rebuilt) is None
    assert gathers(rebuilt) == {"GatherBlockQuantized"}


def gathers(directory: Path) -> set[str]:
    model = onnx.load(str(directory / "model.onnx"), load_external_data=False)
    return {node.op_type for node in model.graph.node if node.input[1:2] == ["input_ids"]}
