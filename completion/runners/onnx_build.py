"""Build the ONNX Runtime GenAI copy of a plain (safetensors) model with the engine's own builder.

The builder (`onnxruntime_genai.models.builder`) writes the decoder graph with its KV cache inputs,
quantises every matrix multiplication to blocks of 32 weights (`MatMulNBits`: 4 or 8 bits,
computed with int8 activations on the CPU) and the engine's configuration. It quantizes the token
embedding too (`GatherBlockQuantized`), but at 4 bits only: for an 8-bit build,
`completion.runners.onnx_embedding` quantizes the float32 table it leaves to 8 bits afterwards
(`LAYOUT` 2). Both run in child processes: the builder prints its progress on standard output,
which in the language server is the LSP stream, and both need a few GB of memory for a moment
that the server should not keep.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Files of the plain model the runner reads besides what the builder writes (stop tokens).
CARRIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")
BUILD_TIMEOUT_S = 1800
# How a build is laid out (recorded in the manifest; an older copy is built again):
# 1, the builder's output; 2, with an 8-bit build's embedding table quantized to 8 bits.
LAYOUT = 2
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


def _run(what: str, command: list[str]) -> None:
    """Run `command` in a child process; RuntimeError with the end of its output if it fails."""
    environment = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} ran past {BUILD_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        output = done.stdout.decode("utf-8", "replace")
        raise RuntimeError(f"{what} failed (exit status {done.returncode}): {output[-_TAIL:]}")


def quantize_embedding_in_child(model_dir: Path) -> None:
    """`completion.runners.onnx_embedding` on `model_dir`, in a child process."""
    command = [sys.executable, "-m", "completion.runners.onnx_embedding", str(model_dir)]
    _run("quantizing the embedding", command)


def build_into(plain: Path, work: Path, quantization: str) -> None:
    """Write the engine's model for `plain` into the empty directory `work`.

    `quantization` is `int4` or `int8` (the weights' bits). Raises RuntimeError with the end of
    the builder's output when it fails.
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
        _run("the ONNX builder", command)
        if not (work / "genai_config.json").is_file():
            raise RuntimeError("the ONNX builder wrote no genai_config.json")
        if quantization == "int8":
            quantize_embedding_in_child(work)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name in CARRIED:
        if (plain / name).is_file() and not (work / name).exists():
            shutil.copyfile(plain / name, work / name)
