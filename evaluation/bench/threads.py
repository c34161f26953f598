"""How many torch threads the local runner should use: prefill and decode speed per thread count.

One process, one loaded model; thread counts alternate over several rounds so a change in the
machine's load hits every count alike. The baseline is every core.

    tabloop bench threads [--model bundled] [--threads 1,2] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

PROMPT = "<|fim_prefix|>def fibonacci(n):\n    <|fim_suffix|>\n<|fim_middle|>"


def _never(text: str) -> int | None:
    return None


def main(argv: list[str]) -> int:
    """Measure each thread count and print one JSON report."""
    parser = argparse.ArgumentParser(prog="tabloop bench threads", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--threads", default="")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)

    import torch

    from common.paths import default_cache_dir
    from completion.runners.torch_runner import TorchRunner
    from completion.types import CancelToken

    cores = os.cpu_count() or 1
    counts = [int(n) for n in args.threads.split(",") if n] or sorted({1, cores})
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    runner = TorchRunner(args.model, cache_dir, dtype="float32", threads=cores, reuse_cache=False)
    samples: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
    for _ in range(args.rounds):
        for count in counts:
            torch.set_num_threads(count)
            gen = runner.generate(
                PROMPT, max_new_tokens=args.new_tokens, stop=_never, cancel=CancelToken()
            )
            steps = max(gen.new_tokens - 1, 1)
            samples[count].append((gen.prefill_ms, steps / (gen.decode_ms / 1000)))
    results = {
        str(n): {
            "prefill_ms": round(statistics.median(p for p, _ in rows), 1),
            "decode_tok_s": round(statistics.median(d for _, d in rows), 3),
        }
        for n, rows in samples.items()
    }
    base = results.get(str(cores))
    report = {
        "benchmark": "threads",
        "model_id": runner.model_id,
        "cores": cores,
        "load_average": os.getloadavg()[0],
        "baseline": str(cores),
        "results": results,
        "decode_ratio_to_baseline": {
            n: round(r["decode_tok_s"] / base["decode_tok_s"], 3) for n, r in results.items()
        }
        if base
        else {},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
