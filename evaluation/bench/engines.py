"""The local engines side by side: torch float32 (the baseline), CTranslate2 int8 (the default
before) and ONNX Runtime GenAI int8 (the default).

The same 20 fill-in-the-middle prompts cut from real standard-library files (short, medium and
about 1,000 tokens) go through every runner in one process, in a rotating order per prompt so that
a machine that gets busier hurts all alike: time to the first token, decode tokens/s, the whole
request's p50/p95, `speedup_p50` (against torch) and `speedup_p50_vs_ctranslate2`, and the share of
greedy outputs identical to float32's. Each prompt is read whole (no state kept from the one
before). Every engine runs on the same number of threads (`--threads`, default: every core, the
fast engines' default), and the report says what each runner actually loaded: its threads and its
weights' format and size, read off the loaded model (the ONNX graph's quantized matmuls, the
CTranslate2 generator's compute type, torch's parameters), not off the settings. `--int4` adds
ONNX Runtime GenAI with 4-bit weights as a row of its own.

Then each engine is loaded by a real language server (`python -m lsp_server`, bundled model,
index off, telemetry off) and that process's resident memory is read after a typing session: a
completion request at each of `--memory-requests` cursors down a real file, as typing moves the
cursor through it (memory grows with the prompts and caches a session builds, not just with the
weights).

The decode speed is also put against the machine's limit: decoding reads every weight once per
token, so weights bytes / time per token is the memory bandwidth the engine achieves, reported
beside a plain copy's bandwidth measured in the same run.

    tabloop bench engines [--model bundled] [--prompts 20] [--new-tokens 32] [--threads N]
                          [--int4] [--memory-requests 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from common.machine import cpu_description

SIZES = (("short", 600), ("medium", 1800), ("long", 4000))  # prefix characters of each kind
FILES = (
    "textwrap.py",
    "argparse.py",
    "json/decoder.py",
    "csv.py",
    "dataclasses.py",
    "shutil.py",
    "pathlib/_local.py",
    "fractions.py",
    "inspect.py",
    "typing.py",
)


def _never(_text: str) -> int | None:
    return None


def prompts(count: int) -> list[dict[str, Any]]:
    """`count` FIM prompts cut at line starts inside real files, of three sizes in turn."""
    from completion.fim import template_for

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in FILES if (stdlib / name).is_file()]
    template = template_for("qwen")
    found: list[dict[str, Any]] = []
    index = 0
    while len(found) < count:
        kind, prefix_chars = SIZES[index % len(SIZES)]
        path = files[index % len(files)]
        source = path.read_text(encoding="utf-8")
        # A cursor after an indented line's first word, about 60% into the file.
        anchor = int(len(source) * (0.35 + 0.05 * (index % 7)))
        line_start = source.index("\n", anchor) + 1
        line = source[line_start : source.index("\n", line_start)]
        stripped = line.lstrip()
        cursor = line_start + len(line) - len(stripped) + max(1, len(stripped) // 3)
        prefix = source[max(0, cursor - prefix_chars) : cursor]
        suffix = source[cursor : cursor + prefix_chars // 4]
        found.append(
            {
                "kind": kind,
                "file": str(path.relative_to(stdlib)),
                "prompt": template.build(prefix, suffix),
            }
        )
        index += 1
    return found


def _measure(runner: Any, prompt: str, new_tokens: int) -> dict[str, Any]:
    from completion.types import CancelToken

    started = time.perf_counter()
    result = runner.generate(prompt, max_new_tokens=new_tokens, stop=_never, cancel=CancelToken())
    total_ms = (time.perf_counter() - started) * 1000
    steps = max(result.new_tokens - 1, 1)
    return {
        "prompt_tokens": result.prompt_tokens,
        "new_tokens": result.new_tokens,
        "ttft_ms": round(result.prefill_ms, 1),
        "decode_tok_s": round(steps / max(result.decode_ms / 1000, 1e-9), 2),
        "total_ms": round(total_ms, 1),
        "text": result.text,
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals = [r["total_ms"] for r in rows]
    cuts = statistics.quantiles(totals, n=20, method="inclusive") if len(totals) > 1 else totals
    return {
        "ttft_ms_p50": round(statistics.median(r["ttft_ms"] for r in rows), 1),
        "decode_tok_s_p50": round(statistics.median(r["decode_tok_s"] for r in rows), 2),
        "total_ms_p50": round(statistics.median(totals), 1),
        "total_ms_p95": round(cuts[-1], 1),
        "by_kind": {
            kind: {
                "prompt_tokens_p50": statistics.median(
                    r["prompt_tokens"] for r in rows if r["kind"] == kind
                ),
                "ttft_ms_p50": round(
                    statistics.median(r["ttft_ms"] for r in rows if r["kind"] == kind), 1
                ),
                "total_ms_p50": round(
                    statistics.median(r["total_ms"] for r in rows if r["kind"] == kind), 1
                ),
            }
            for kind, _ in SIZES
            if any(r["kind"] == kind for r in rows)
        },
    }


def copy_bandwidth_gb_s(megabytes: int = 512) -> float:
    """A plain memory copy's bandwidth on this machine (best of 3), in GB/s."""
    import numpy as np

    source = np.ones(megabytes * 2**20, dtype=np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    # A copy reads and writes every byte.
    return round(2 * source.nbytes / best / 1e9, 2)


def server_memory_mb(client: Any) -> dict[str, float]:
    """The language server's resident memory now and at its peak (Linux), in MB."""
    pid = client._server.pid if client._server else None
    memory: dict[str, int] = {}
    if pid is not None:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                memory[name] = int(value.split()[0])
    return {
        "rss_mb": round(memory.get("VmRSS", 0) / 1024, 1),
        "peak_rss_mb": round(memory.get("VmHWM", 0) / 1024, 1),
        # Of `rss_mb`: the process's own memory, and pages of files it maps (libraries, the
        # model's weights), which the system can drop and read again.
        "anonymous_mb": round(memory.get("RssAnon", 0) / 1024, 1),
        "file_backed_mb": round(memory.get("RssFile", 0) / 1024, 1),
    }


async def _server_rss_mb(
    engine: str, dtype: str, model: str, cache_dir: Path, threads: int, requests: int
) -> dict[str, Any]:
    """A language server's resident memory after `requests` completions down a real file."""
    from evaluation.lsp_client import TabloopClient

    source = (Path(sysconfig.get_paths()["stdlib"]) / FILES[0]).read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    with tempfile.TemporaryDirectory(prefix="tabloop-engines-") as root:
        client = TabloopClient()
        await client.launch(
            Path(root),
            {
                "cacheDir": str(cache_dir),
                "completion": {
                    "model": model,
                    "engine": engine,
                    "dtype": dtype,
                    **({"threads": threads} if threads else {}),
                },
                "index": {"enabled": False},
                "telemetry": {"level": "off"},
            },
        )
        try:
            status = await client.wait_until_ready(900)
            path = Path(root) / FILES[0]
            path.write_text(source, encoding="utf-8")
            uri = client.open(path, source)
            answered = 0
            # Cursors at the ends of lines spread down the file, as typing moves through it.
            for number in range(requests):
                line = (number + 1) * len(lines) // (requests + 1)
                character = len(lines[line].rstrip("\n").encode("utf-16-le")) // 2
                answered += bool(await client.inline(uri, line, character, invoked=False))
            return {
                "state": status["model"]["state"],
                "model_id": status["model"]["modelId"],
                "requests": requests,
                "answered": answered,
                **server_memory_mb(client),
            }
        finally:
            await client.close_server()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop bench engines", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--threads", type=int, default=0, help="threads of every engine (0: every core)"
    )
    parser.add_argument("--int4", action="store_true", help="add ONNX Runtime GenAI int4")
    parser.add_argument(
        "--memory-requests",
        type=int,
        default=20,
        help="completions in the typing session before a server's memory is read",
    )
    parser.add_argument("--skip-memory", action="store_true", help="do not start servers")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the servers' resident memory"
    )
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    return parser


# name in the report -> (completion.engine, completion.dtype)
ENGINES = {
    "torch-float32": ("torch", "float32"),
    "ctranslate2-int8": ("ctranslate2", "int8"),
    "onnxruntime-int8": ("onnxruntime", "int8"),
}
BASELINE, BEFORE, DEFAULT = "torch-float32", "ctranslate2-int8", "onnxruntime-int8"
INT4 = "onnxruntime-int4"


def main(argv: list[str]) -> int:
    """Run every engine on the same prompts and print one JSON report."""
    args = _parser().parse_args(argv)
    from common.paths import default_cache_dir
    from completion.runners.ct2 import Ct2Runner, default_threads
    from completion.runners.onnx import OnnxRunner
    from completion.runners.torch_runner import TorchRunner

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    command = "tabloop bench engines " + " ".join(argv)
    # One thread count for all: the fast engines' default (every core) unless asked; torch's
    # own default would be one thread fewer, which is not a comparison on equal terms.
    threads = args.threads or default_threads()
    if args.memory_only:
        memory = _memory(args, cache_dir, threads)
        print(json.dumps({"benchmark": "engines", "command": command, **memory}))
        return 0
    # The fast engines first: their thread set-up must not change the torch runner's thread
    # count, which the torch runner sets when it loads.
    fast = OnnxRunner(args.model, cache_dir, threads=threads, reuse_prefix=False)
    before = Ct2Runner(args.model, cache_dir, threads=threads, reuse_prefix=False)
    extra: dict[str, Any] = {}
    if args.int4:
        extra[INT4] = OnnxRunner(
            args.model, cache_dir, precision="int4", threads=threads, reuse_prefix=False
        )
    torch_runner = TorchRunner(args.model, cache_dir, threads=threads, reuse_cache=False)
    runners: dict[str, Any] = {BASELINE: torch_runner, BEFORE: before, DEFAULT: fast, **extra}
    loaded = {name: loaded_weights(runner) for name, runner in runners.items()}
    cases = prompts(args.prompts)
    load_before = os.getloadavg()[0]
    for runner in runners.values():  # warm-up: first-call allocations are not the engine's speed
        runner.generate(cases[0]["prompt"], max_new_tokens=2, stop=_never, cancel=_token())
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    order = list(runners)
    for index, case in enumerate(cases):
        turn = index % len(order)
        for name in order[turn:] + order[:turn]:
            row = _measure(runners[name], case["prompt"], args.new_tokens)
            rows[name].append({"kind": case["kind"], "file": case["file"], **row})
    summaries = {name: _summary(found) for name, found in rows.items()}
    for name, found in rows.items():
        same = sum(a["text"] == b["text"] for a, b in zip(rows[BASELINE], found, strict=True))
        summaries[name]["identical_to_float32"] = round(same / len(cases), 3)
    new, old, base = summaries[DEFAULT], summaries[BEFORE], summaries[BASELINE]
    report: dict[str, Any] = {
        "benchmark": "engines",
        "command": command,
        "model": args.model,
        "baseline": BASELINE,
        "new_default": DEFAULT,
        "engine": fast.describe(),
        "engine_before": before.describe(),
        # What each runner loaded, read off the loaded model: threads, weights' format and size.
        "loaded": loaded,
        "prompts": len(cases),
        "new_tokens": args.new_tokens,
        "summary": summaries,
        "speedup_p50": round(base["total_ms_p50"] / new["total_ms_p50"], 2),
        "ttft_speedup_p50": round(base["ttft_ms_p50"] / new["ttft_ms_p50"], 2),
        "decode_speedup_p50": round(new["decode_tok_s_p50"] / base["decode_tok_s_p50"], 2),
        "speedup_p50_vs_ctranslate2": round(old["total_ms_p50"] / new["total_ms_p50"], 2),
        "decode_speedup_p50_vs_ctranslate2": round(
            new["decode_tok_s_p50"] / old["decode_tok_s_p50"], 2
        ),
        "identical_to_float32": new["identical_to_float32"],
        # Other work on the machine slows the two-thread engines more than the baseline.
        "cpu": cpu_description(),
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "limit": {
            name: {
                "weights_mb": loaded[name]["weights_mb"],
                "decode_gb_s_achieved": round(
                    loaded[name]["weights_mb"] * 2**20 * summaries[name]["decode_tok_s_p50"] / 1e9,
                    2,
                ),
            }
            for name in runners
            if name != BASELINE
        },
        "copy_gb_s_measured": copy_bandwidth_gb_s(),
        "rows": rows,
    }
    for runner in runners.values():
        runner.close()
    del torch_runner, fast, before, runners, extra
    if not args.skip_memory:
        report.update(_memory(args, cache_dir, threads))
    print(json.dumps(report, indent=2))
    return 0


def loaded_weights(runner: Any) -> dict[str, Any]:
    """What a runner loaded, read off the model in memory or on disk: the weights' format, their
    size, and the threads it computes on."""
    from completion.runners.ct2 import Ct2Runner
    from completion.runners.onnx import OnnxRunner

    if isinstance(runner, OnnxRunner):
        return {
            "weights": _onnx_weight_format(runner.path / "model.onnx"),
            "weights_mb": _megabytes(runner.path / "model.onnx.data"),
            "threads": runner.threads,
            "path": str(runner.path),
        }
    if isinstance(runner, Ct2Runner):
        return {
            "weights": f"ctranslate2 {runner.generator.compute_type}",
            "weights_mb": _megabytes(runner.path / "model.bin"),
            "threads": runner.threads,
            "path": str(runner.path),
        }
    import torch

    parameters = list(runner.model.parameters())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
    size = sum(p.numel() * p.element_size() for p in parameters)
    weights = "torch " + "+".join(dtypes)
    packed = getattr(runner, "packed_linears", 0)
    if packed:
        from completion.runners.packed import packed_bytes

        size += packed_bytes(runner.model)  # the packed weights are not parameters
        weights += ", linear layers packed for oneDNN"
    return {
        "weights": weights,
        "weights_mb": round(size / 2**20, 1),
        "packed_linears": packed,
        "threads": int(torch.get_num_threads()),
        "path": runner.model_id,
    }


def _onnx_weight_format(graph_path: Path) -> str:
    """The quantized matmuls' bit widths in an ONNX graph (weights stay in the external file)."""
    import onnx

    graph = onnx.load(str(graph_path), load_external_data=False).graph
    bits = sorted(
        {
            attribute.i
            for node in graph.node
            if node.op_type == "MatMulNBits"
            for attribute in node.attribute
            if attribute.name == "bits"
        }
    )
    if not bits:
        return "onnx float matmuls"
    return "onnx MatMulNBits " + "+".join(f"int{b}" for b in bits)


def _megabytes(path: Path) -> float:
    return round(path.stat().st_size / 2**20, 1)


def _memory(args: argparse.Namespace, cache_dir: Path, threads: int) -> dict[str, Any]:
    """Resident memory of a language server with each engine, after a typing session."""
    engines = {**ENGINES, **({INT4: ("onnxruntime", "int4")} if args.int4 else {})}
    return {
        "server_rss_mb": {
            name: asyncio.run(
                _server_rss_mb(engine, dtype, args.model, cache_dir, threads, args.memory_requests)
            )
            for name, (engine, dtype) in engines.items()
        }
    }


def _token() -> Any:
    from completion.types import CancelToken

    return CancelToken()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
