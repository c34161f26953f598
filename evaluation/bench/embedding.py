"""`tabloop bench embedding`: the ONNX copy's token embedding in 8 bits (layout 2, the default)
against the float32 table the engine's builder writes (layout 1), on the same prompts in one run.

Both copies are built here from the same plain model, by the builder, then one of them rewritten
by `completion.runners.onnx_embedding.quantize_embedding`, into a temporary directory: both are
as fresh as a new conversion, wholly in the page cache. Each is loaded by a child process of its
own (ONNX Runtime GenAI with the language server's session options), one after the other, which
reads the `tabloop bench engines` prompts (three sizes in turn, real standard-library files) and
writes `--new-tokens` greedy tokens after each, and reports its resident memory (all of it, and
the pages mapped from the weights file) after each of `--checkpoints` prompts, its time, and the
tokens it wrote. The report gives both, the differences, and how many greedy outputs are
identical.

    tabloop bench embedding [--prompts 137] [--checkpoints 20,137] [--new-tokens 24]
                            [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from common.paths import resolve_cache_dir

WEIGHTS = "model.onnx.data"


def _resident(weights: Path) -> dict[str, float]:
    """This process's resident memory, and the part of it mapped from `weights`, in MB."""
    total = mapped = 0
    in_weights = False
    with open("/proc/self/smaps", encoding="utf-8") as handle:
        for line in handle:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                in_weights = line.rstrip().endswith(str(weights))
            elif first == "Rss:":
                kb = int(line.split()[1])
                total += kb
                mapped += kb if in_weights else 0
    return {"rss_mb": round(total / 1024, 1), "weights_file_mb": round(mapped / 1024, 1)}


def child(
    model_dir: Path, count: int, checkpoints: list[int], new_tokens: int, threads: int
) -> int:
    """Load `model_dir`, run the prompts, print the JSON the parent reads."""
    import onnxruntime_genai as og
    from tokenizers import Tokenizer

    from evaluation.bench.engines import prompts

    config = og.Config(str(model_dir))
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    options["enable_cpu_mem_arena"] = False  # as the language server's runner
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    report: dict[str, Any] = {"loaded": _resident(model_dir / WEIGHTS), "after": {}, "outputs": []}
    started = time.perf_counter()
    for number, item in enumerate(prompts(count), 1):
        ids = tokenizer.encode(item["prompt"], add_special_tokens=False).ids
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        written: list[int] = []
        while not generator.is_done() and len(written) < new_tokens:
            generator.generate_next_token()
            written.append(int(generator.get_next_tokens()[0]))
        del generator
        report["outputs"].append(written)
        if number in checkpoints:
            report["after"][str(number)] = _resident(model_dir / WEIGHTS)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report))
    return 0


def _build(plain: Path, target: Path, eight_bit_embedding: bool) -> None:
    from completion.runners.onnx_build import build_into

    target.mkdir()
    build_into(plain, target, "int8", eight_bit_embedding=eight_bit_embedding)


def _run_child(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "evaluation.bench.embedding",
        "--child",
        str(model_dir),
        "--prompts",
        str(args.prompts),
        "--checkpoints",
        args.checkpoints,
        "--new-tokens",
        str(args.new_tokens),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tabloop bench embedding: the child failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench embedding", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--prompts", type=int, default=137)
    parser.add_argument("--checkpoints", default="20,137", help="prompts after which to read")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    checkpoints = sorted({int(n) for n in args.checkpoints.split(",")} | {args.prompts})
    if args.child:
        return child(Path(args.child), args.prompts, checkpoints, args.new_tokens, args.threads)

    from completion.runners.loading import ensure_plain_copy, resolve_source

    cache_dir = resolve_cache_dir(args.cache_dir or None)
    plain = ensure_plain_copy(resolve_source(args.model, cache_dir), cache_dir)
    scratch = Path(tempfile.mkdtemp(prefix="bench-embedding-", dir=cache_dir))
    try:
        layouts = {"float32_table": scratch / "float32", "int8_table": scratch / "int8"}
        for name, target in layouts.items():
            _build(plain, target, eight_bit_embedding=name == "int8_table")
        runs = {name: _run_child(target, args) for name, target in layouts.items()}
        sizes = {
            name: round((t / WEIGHTS).stat().st_size / 2**20, 1) for name, t in layouts.items()
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base, new = runs["float32_table"], runs["int8_table"]
    identical = sum(a == b for a, b in zip(base["outputs"], new["outputs"], strict=True))
    report = {
        "benchmark": "embedding",
        "command": "tabloop bench embedding " + " ".join(argv),
        "cpu": cpu_description(),
        "settings": {
            "model": args.model,
            "prompts": args.prompts,
            "new_tokens": args.new_tokens,
            "threads": args.threads,
            "engine": "onnxruntime-genai int8, no memory arena",
        },
        "weights_file_mb": sizes,
        "resident": {
            name: {"loaded": run["loaded"], "after_prompts": run["after"]}
            for name, run in runs.items()
        },
        "rss_saved_mb": {
            n: round(base["after"][n]["rss_mb"] - new["after"][n]["rss_mb"], 1)
            for n in base["after"]
        },
        "seconds": {name: run["seconds"] for name, run in runs.items()},
        "greedy_outputs_identical": f"{identical} of {len(base['outputs'])}",
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
