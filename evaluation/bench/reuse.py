"""Can the fast engine reuse a prompt's prefix across keystrokes? CTranslate2's static prompt.

While the user types on one line, the fill-in-the-middle prompt changes only after the start of
that line: `<|fim_prefix|>` and every earlier line stay the same. CTranslate2 can keep the model
state after a fixed "static prompt" (`static_prompt=`, `cache_static_prompt=True`) and start the
next generation from it. This bench measures, on the same prompts as `tabloop bench engines`
(cut at the start of the cursor's line):

- time to the first token with the whole prompt computed (the baseline, the default runner's path)
  against the same prompt with its stable part served from the static-prompt cache, and whether
  the generated tokens are identical;
- what the cache costs: the process's resident memory after caching `--distinct` different
  stable parts, as a user typing on that many lines would, per cached part.

    tabloop bench reuse [--model bundled] [--prompts 9] [--distinct 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "VmRSS":
            return int(value.split()[0]) / 1024
    return 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench reuse", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--prompts", type=int, default=9)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--distinct", type=int, default=8, help="stable parts cached for memory")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)

    from common.paths import default_cache_dir
    from completion.runners.ct2 import Ct2Runner
    from evaluation.bench.engines import prompts

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    runner = Ct2Runner(args.model, cache_dir)
    generator, tokenizer = runner.generator, runner.tokenizer

    def pieces(ids: list[int]) -> list[str]:
        return [tokenizer.id_to_token(i) or "" for i in ids]

    def first_token_ms(stable: list[int], rest: list[int], cached: bool) -> tuple[float, list[int]]:
        first: list[float] = []

        def on_token(_step: Any) -> bool:
            if not first:
                first.append(time.perf_counter())
            return False

        options: dict[str, Any] = {
            "max_length": args.new_tokens,
            "sampling_topk": 1,
            "include_prompt_in_result": False,
            "callback": on_token,
        }
        started = time.perf_counter()
        if cached:
            results = generator.generate_batch(
                [pieces(rest)], static_prompt=pieces(stable), cache_static_prompt=True, **options
            )
        else:
            results = generator.generate_batch([pieces(stable + rest)], **options)
        return (first[0] - started) * 1000, list(results[0].sequences_ids[0])

    rows = []
    cases = prompts(args.prompts)
    first_token_ms(*_split(tokenizer, cases[0]["prompt"]), cached=False)  # warm-up
    rss_before = _rss_mb()
    for case in cases:
        stable, rest = _split(tokenizer, case["prompt"])
        whole_ms, whole_ids = first_token_ms(stable, rest, cached=False)
        first_token_ms(stable, rest, cached=True)  # fills the cache: the first keystroke's cost
        reused_ms, reused_ids = first_token_ms(stable, rest, cached=True)
        rows.append(
            {
                "kind": case["kind"],
                "file": case["file"],
                "stable_tokens": len(stable),
                "recomputed_tokens": len(rest),
                "ttft_whole_ms": round(whole_ms, 1),
                "ttft_reused_ms": round(reused_ms, 1),
                "identical": whole_ids == reused_ids,
            }
        )
    rss_after_prompts = _rss_mb()
    # Memory: one stable part per line the user moves to; CTranslate2 keeps every one.
    stable, rest = _split(tokenizer, cases[-1]["prompt"])
    for cut in range(1, args.distinct + 1):
        first_token_ms(stable[:-cut], stable[-cut:] + rest, cached=True)
    rss_after_distinct = _rss_mb()
    whole = statistics.median(r["ttft_whole_ms"] for r in rows)
    reused = statistics.median(r["ttft_reused_ms"] for r in rows)
    report = {
        "benchmark": "prefix-reuse",
        "command": "tabloop bench reuse " + " ".join(argv),
        "engine": runner.describe(),
        "prompts": len(rows),
        "new_tokens": args.new_tokens,
        "baseline": "whole prompt computed (the default runner)",
        "ttft_whole_ms_p50": round(whole, 1),
        "ttft_reused_ms_p50": round(reused, 1),
        "ttft_speedup_p50": round(whole / max(reused, 1e-9), 2),
        "identical_outputs": sum(r["identical"] for r in rows) / len(rows),
        "rss_mb": {
            "before": round(rss_before, 1),
            "after_prompts": round(rss_after_prompts, 1),
            "after_distinct": round(rss_after_distinct, 1),
        },
        "distinct_parts_cached": args.distinct,
        "rss_mb_per_cached_part": round(
            (rss_after_distinct - rss_after_prompts) / max(args.distinct, 1), 1
        ),
        "rows": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


def _split(tokenizer: Any, prompt: str) -> tuple[list[int], list[int]]:
    """Token ids of `prompt`, split at the start of the cursor's line: (stable, recomputed).

    The split is made in the text and each side tokenized alone, as a runner would have to, so
    the two parts together may tokenize a little differently from the whole; both measurements
    use exactly these ids."""
    marker = "<|fim_suffix|>"
    cursor = prompt.index(marker)
    line_start = prompt.rfind("\n", 0, cursor) + 1
    encode = tokenizer.encode
    stable = encode(prompt[:line_start], add_special_tokens=False).ids
    rest = encode(prompt[line_start:], add_special_tokens=False).ids
    return list(stable), list(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
