"""An adapter for ONNX Runtime GenAI by patching the base copy: the builder's bytes, or the builder.

`completion.runners.onnx_patch` claims that re-quantising the adapted matrices of the engine's
copy of the base model writes exactly what merging with peft and converting with the builder
writes. These tests build both from the tiny model and compare the files byte for byte, then hold
the patch to its refusals: a base copy made another way, an adapter of another kind, a damaged
adapter.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from common.manifest import MANIFEST, verify
from completion.adapters import AdapterError, read_manifest
from completion.runners.conversion import ensure_converted
from completion.runners.loading import ModelSource, ensure_plain_copy, resolve_source
from completion.runners.merge import adapter_key, ensure_merged, merged_path
from completion.runners.onnx_patch import DATA_FILE, GRAPH_FILE, Unpatchable, patch_into
from completion.runners.torch_runner import TorchRunner
from tests.support import adapters as damage
from tests.support.adapters import strong_adapter


@pytest.fixture(scope="module")
def source(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return resolve_source(str(tiny_model_path), tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def adapter(
    source: ModelSource, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    runner = TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("torch"), threads=1)
    base_model_id = runner.base_model_id
    runner.close()
    scratch = tmp_path_factory.mktemp("adapter")
    return strong_adapter(source, base_model_id, scratch / "cache", scratch / "adapter")


@pytest.fixture(scope="module")
def base(source: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's copy of the tiny model, made by the builder."""
    return ensure_converted(source, "int8", tmp_path_factory.mktemp("base"), engine="onnxruntime")


def _merged(source: ModelSource, adapter: Path, cache: Path) -> Path:
    (cache / "models").mkdir(parents=True, exist_ok=True)
    return ensure_merged(source, adapter, "int8", cache, engine="onnxruntime")


def _refuse(*_args: object) -> int:
    raise Unpatchable("refused in this test")


def test_the_patched_copy_is_the_builders_byte_for_byte(
    source: ModelSource, adapter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patched = _merged(source, adapter, tmp_path / "patched")
    assert "quantised again" in json.loads((patched / MANIFEST).read_text())["made_by"]
    assert verify(patched) is None

    with monkeypatch.context() as patch:
        patch.setattr("completion.runners.onnx_patch.patch_into", _refuse)
        built = _merged(source, adapter, tmp_path / "built")
    assert "builder" in json.loads((built / MANIFEST).read_text())["made_by"]

    assert (patched / DATA_FILE).read_bytes() == (built / DATA_FILE).read_bytes()
    assert (patched / GRAPH_FILE).read_bytes() == (built / GRAPH_FILE).read_bytes()
    key = adapter_key(read_manifest(adapter))
    assert patched == merged_path(source, key, "int8", tmp_path / "patched", "onnxruntime")


def test_the_patch_changes_the_adapted_matrices_and_nothing_else(
    source: ModelSource, adapter: Path, base: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    replaced = patch_into(base, ensure_plain_copy(source, tmp_path), adapter, work)
    assert replaced == 2 * 5  # per layer: q/k/v packed in one, o, gate, up, down
    before, after = (np.frombuffer((d / DATA_FILE).read_bytes(), np.uint8) for d in (base, work))
    changed = np.flatnonzero(before != after)
    assert changed.size > 0
    embedding = _initializer_span(base, "model.embed_tokens")
    assert not np.any((changed >= embedding[0]) & (changed < embedding[1]))
    assert sorted(p.name for p in work.iterdir()) == sorted(
        p.name for p in base.iterdir() if p.name != MANIFEST and not p.name.startswith(".")
    )


def _initializer_span(model: Path, prefix: str) -> tuple[int, int]:
    """The byte range in the data file of the initializers named `prefix...`."""
    import onnx

    graph = onnx.load(str(model / GRAPH_FILE), load_external_data=False).graph
    spans = []
    for tensor in graph.initializer:
        external = {entry.key: entry.value for entry in tensor.external_data}
        if tensor.name.startswith(prefix) and "length" in external:
            start = int(external.get("offset", 0))
            spans.append((start, start + int(external["length"])))
    assert spans, prefix
    return min(s for s, _ in spans), max(e for _, e in spans)


def test_a_base_copy_made_another_way_is_refused_and_nothing_is_left(
    source: ModelSource, adapter: Path, base: Path, tmp_path: Path
) -> None:
    """The patch checks that quantising the plain weights gives the base copy's bytes: a base
    copy whose projection differs is refused before anything is kept."""
    other = tmp_path / "other-base"
    other.mkdir()
    for item in base.iterdir():
        (other / item.name).write_bytes(item.read_bytes())
    start, _end = _initializer_span(base, "model.layers.1.mlp.down_proj")
    with (other / DATA_FILE).open("r+b") as data:
        data.seek(start)
        first = data.read(1)
        data.seek(start)
        data.write(bytes([first[0] ^ 0x01]))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(Unpatchable, match="not the base copy's"):
        patch_into(other, ensure_plain_copy(source, tmp_path), adapter, work)
    assert list(work.iterdir()) == []


def test_an_adapter_of_another_kind_goes_to_the_builder(
    source: ModelSource, adapter: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An adapter with a scaling of its own for some modules (`alpha_pattern`) is not patched:
    peft merges it and the builder converts it, and it serves."""
    other = tmp_path / "alpha-pattern"
    other.mkdir()
    for item in adapter.iterdir():
        (other / item.name).write_bytes(item.read_bytes())
    damage.rewrite_config(other, {"alpha_pattern": {"q_proj": 8}})
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(Unpatchable, match="alpha_pattern"):
        patch_into(tmp_path, tmp_path, other, work)
    with caplog.at_level(logging.INFO, logger="completion.runners.merge"):
        built = _merged(source, other, tmp_path / "cache")
    assert "alpha_pattern; merging and converting with the builder" in caplog.text
    assert "builder" in json.loads((built / MANIFEST).read_text())["made_by"]
    assert verify(built) is None


def test_a_damaged_adapter_is_refused_before_anything_is_made(
    source: ModelSource, adapter: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in adapter.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    damage.wrong_shape(broken)
    cache = tmp_path / "cache"
    with pytest.raises(AdapterError):
        _merged(source, broken, cache)
    assert not (cache / "models" / "onnx" / "merged").exists() or not any(
        p for p in (cache / "models" / "onnx" / "merged").iterdir() if not p.name.endswith(".lock")
    )


def test_a_plain_model_in_shards_patches_as_one_file(
    source: ModelSource, adapter: Path, base: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    plain = ensure_plain_copy(source, tmp_path)
    tensors = load_file(str(plain / "model.safetensors"))
    names = sorted(tensors)
    shards = tmp_path / "shards"
    shards.mkdir()
    half = len(names) // 2
    for index, part in enumerate((names[:half], names[half:]), 1):
        save_file(
            {name: tensors[name] for name in part}, str(shards / f"model-0000{index}.safetensors")
        )
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    assert patch_into(base, plain, adapter, one) == patch_into(base, shards, adapter, two)
    assert (one / DATA_FILE).read_bytes() == (two / DATA_FILE).read_bytes()
