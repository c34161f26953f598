"""Which dtype the local runner should use on this CPU: bf16 vs float32 vs dynamic int8.

Each dtype is measured in a fresh process (so resident memory is its own): load time, prefill
tokens/s on a real standard-library FIM prompt, decode tokens/s, resident memory with the model
loaded, whether greedy output matches float32's, and what KV-prefix reuse saves on a keystroke.
float32 is the baseline; every other dtype is also reported as a ratio to it.

    tabloop bench dtype [--model bundled] [--dtypes float32,bfloat16,int8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, cast

BASELINE = "float32"
SOURCE_FILE = "textwrap.py"


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _prompts(prompt_chars: int) -> tuple[str, str]:
    """A FIM prompt cut from real code at a function body, and the same after one keystroke."""
    from completion.fim import template_for

    source = (Path(sysconfig.get_paths()["stdlib"]) / SOURCE_FILE).read_text(encoding="utf-8")
    cursor = source.index("    def _split(self, text):\n") + len("    def _split(self, text):\n")
    prefix = source[max(0, cursor - prompt_chars) : cursor] + "        "
    suffix = source[cursor : cursor + prompt_chars // 4]
    template = template_for("qwen")
    return template.build(prefix, suffix), template.build(prefix + "c", suffix)


def _never(text: str) -> int | None:
    return None


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Measure one dtype in this process."""
    from completion.runners.loading import Dtype
    from completion.runners.torch_runner import TorchRunner
    from completion.types import CancelToken

    started = time.perf_counter()
    dtype = cast(Dtype, BASELINE if args.child == "first-load" else args.child)
    runner = TorchRunner(
        args.model, Path(args.cache_dir), dtype=dtype, threads=args.threads, reuse_cache=True
    )
    load_s = time.perf_counter() - started
    if args.child == "first-load":
        # GGUF dequantisation plus writing the converted copy that later loads read.
        return {"first_load_s": round(load_s, 2), "model_id": runner.model_id}
    prompt, typed = _prompts(args.prompt_chars)
    runner.generate("def f(x):\n    return", max_new_tokens=2, stop=_never, cancel=CancelToken())
    cold = runner.generate(prompt, max_new_tokens=1, stop=_never, cancel=CancelToken())
    decode = runner.generate(
        prompt, max_new_tokens=args.new_tokens, stop=_never, cancel=CancelToken()
    )
    keystroke = runner.generate(typed, max_new_tokens=1, stop=_never, cancel=CancelToken())
    steps = max(decode.new_tokens - 1, 1)  # the first token comes from the prefill's logits
    return {
        "dtype": args.child,
        "model_id": runner.model_id,
        "load_s": round(load_s, 2),
        "prompt_tokens": cold.prompt_tokens,
        "prefill_ms": round(cold.prefill_ms, 1),
        "prefill_tok_s": round(cold.prompt_tokens / (cold.prefill_ms / 1000), 1),
        "decode_tokens": decode.new_tokens,
        "decode_tok_s": round(steps / (decode.decode_ms / 1000), 2),
        "keystroke_prefill_ms": round(keystroke.prefill_ms, 1),
        "keystroke_reused_tokens": keystroke.reused_tokens,
        "rss_mb": round(_rss_mb(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "text": decode.text,
    }


def _run_child(args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "evaluation.bench.dtype",
        "--child",
        dtype,
        "--model",
        args.model,
        "--cache-dir",
        args.cache_dir,
        "--threads",
        str(args.threads),
        "--prompt-chars",
        str(args.prompt_chars),
        "--new-tokens",
        str(args.new_tokens),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"dtype": dtype, "error": done.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop bench dtype", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--prompt-chars", type=int, default=1600)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str]) -> int:
    """Measure every dtype and print one JSON report with float32 as the baseline."""
    args = _parser().parse_args(argv)
    if not args.cache_dir:
        from common.paths import default_cache_dir

        args.cache_dir = str(default_cache_dir())
    if args.child:
        print(json.dumps(child(args)))
        return 0
    from completion.runners.torch_runner import default_threads

    dtypes = [BASELINE] + [d for d in args.dtypes.split(",") if d and d != BASELINE]
    first_load = _run_child(args, "first-load")
    results = {dtype: _run_child(args, dtype) for dtype in dtypes}
    base = results[BASELINE]
    ratios: dict[str, dict[str, float]] = {}
    for dtype, result in results.items():
        if "error" in result or "error" in base:
            continue
        result["same_text_as_baseline"] = result["text"] == base["text"]
        ratios[dtype] = {
            key: round(result[key] / base[key], 3)
            for key in ("load_s", "prefill_tok_s", "decode_tok_s", "rss_mb")
        }
    fastest = max(
        (d for d in ratios if results[d].get("same_text_as_baseline")),
        key=lambda d: results[d]["decode_tok_s"],
        default=BASELINE,
    )
    report = {
        "benchmark": "dtype",
        "model": args.model,
        "threads": args.threads or default_threads(),
        "baseline": BASELINE,
        "first_load": first_load,
        "results": results,
        "ratio_to_baseline": ratios,
        "fastest_with_baseline_output": fastest,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
