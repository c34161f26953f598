"""Build the ONNX Runtime GenAI copy of a plain (safetensors) model with the engine's own builder.

The builder (`onnxruntime_genai.models.builder`) writes the decoder graph with its KV cache inputs,
quantises every matrix multiplication to blocks of 32 weights (`MatMulNBits`: 4 or 8 bits,
computed with int8 activations on the CPU), the token embedding too for 4 bits
(`GatherBlockQuantized`), and the engine's configuration; for 8 bits the embedding is quantised
afterwards (`onnx_embedding`). It runs in a child process: it prints its progress on standard
output, which in the language server is the LSP stream, and it needs a few GB of memory for a
moment that the server should not keep.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from common.child import run_child

# Files of the plain model the runner reads besides what the builder writes (stop tokens).
CARRIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")
BUILD_TIMEOUT_S = 1800
_TAIL = 1500  # characters of the builder's output kept in an error


def _with_architecture(plain: Path, staged: Path) -> Path:
    """`plain` as the builder reads it: its files linked into `staged`, with `architectures` in
    its config (the plain copy of a GGUF model has only `model_type`)."""
    config = json.loads((plain / "config.json").read_text(encoding="utf-8"))
    if config.get("architectures"):
        return plain
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(config.get("model_type")))
    if name is None:
        raise RuntimeError(f"no causal LM architecture for model type {config.get('model_type')}")
    for item in plain.iterdir():
        if item.name != "config.json":
            (staged / item.name).symlink_to(item.resolve())
    config["architectures"] = [name]
    (staged / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return staged


def build_into(
    plain: Path, work: Path, quantization: str, *, eight_bit_embedding: bool = True
) -> None:
    """Write the engine's model for `plain` into the empty directory `work`.

    `quantization` is `int4` or `int8` (the weights' bits). `eight_bit_embedding` False leaves
    an 8-bit model's token embedding as the builder writes it, in float32 (the first layout, for
    `tabloop bench embedding`). Raises RuntimeError with the end of the builder's output when it
    fails.
    """
    if quantization not in ("int4", "int8"):
        raise RuntimeError(f"ONNX Runtime GenAI runs int4 or int8 weights here, not {quantization}")
    scratch = Path(tempfile.mkdtemp(prefix=".build.", dir=work.parent))
    try:
        staged = scratch / "model"
        staged.mkdir()
        source = _with_architecture(plain, staged)
        command = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "--input",
            str(source),
            "--output",
            str(work),
            "--precision",
            quantization,
            "--execution_provider",
            "cpu",
            "--cache_dir",
            str(scratch / "cache"),
            "--extra_options",
            "op_types_to_quantize=MatMul/Gather",
        ]
        output = run_child(command, timeout_s=BUILD_TIMEOUT_S, what="the ONNX builder")
        if not (work / "genai_config.json").is_file():
            raise RuntimeError(f"the ONNX builder wrote no model: {output[-_TAIL:]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if quantization == "int8" and eight_bit_embedding:
        from completion.runners.onnx_embedding import quantize_embedding

        quantize_embedding(work)  # the builder leaves the token embedding in float32
    for name in CARRIED:
        if (plain / name).is_file() and not (work / name).exists():
            shutil.copyfile(plain / name, work / name)
