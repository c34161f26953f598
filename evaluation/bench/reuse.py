"""Does the fast engine's prompt reuse across keystrokes pay, and what does it cost?

CTranslate2 can start a generation from the model state after a fixed first part of the prompt
(a "static prompt") and keep that state. The runner (`completion/runners/static_prompt.py`)
splits each fill-in-the-middle prompt at a line break a little before the cursor, keeps the
state of one such part from its second use on, and empties the engine's cache (a model reload)
before it keeps another. This bench measures, on the same prompts as `tabloop bench engines`:

- time to the first token with the whole prompt read (a runner with `completion.cache` off, the
  baseline) against the same prompt on a runner that keeps its first part, as the next keystroke
  on the same line would find it; whether the text is the same as the whole-prompt read, and as
  the same request on a runner that had seen nothing before (it must be);
- what it costs: the time to empty the engine's cache, and the resident memory of a process
  whose one runner goes from prompt to prompt (`--prompts` distinct first parts, each prompt
  asked three times; the engine on its own would keep every part), with reuse on and off.

    tabloop bench reuse [--model bundled] [--prompts 9] [--new-tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
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
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    parser.add_argument("--memory-of", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_of:
        print(json.dumps(_memory_walk(args, reuse=args.memory_of == "on")))
        return 0

    from common.machine import cpu_description
    from common.paths import default_cache_dir
    from completion.runners.ct2 import Ct2Runner
    from completion.types import CancelToken
    from evaluation.bench.engines import prompts

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    whole = Ct2Runner(args.model, cache_dir, reuse_prefix=False)
    reusing = Ct2Runner(args.model, cache_dir)
    fresh = Ct2Runner(args.model, cache_dir)  # sees each prompt once

    def run(runner: Ct2Runner, prompt: str) -> Any:
        return runner.generate(
            prompt, max_new_tokens=args.new_tokens, stop=lambda _text: None, cancel=CancelToken()
        )

    cases = prompts(args.prompts)
    run(whole, cases[0]["prompt"])  # warm-up: first-call allocations are not the engine's speed
    assert reusing.reuse is not None and fresh.reuse is not None
    rows = []
    for case in cases:
        prompt = case["prompt"]
        cold = run(whole, prompt)
        run(reusing, prompt)  # the first keystroke here: read whole, nothing kept
        run(reusing, prompt)  # the second: its first part kept (after emptying the cache)
        kept = run(reusing, prompt)  # the keystrokes after: the first part served
        first = run(fresh, prompt)  # after another prompt: read without keeping anything
        rows.append(
            {
                "kind": case["kind"],
                "file": case["file"],
                "prompt_tokens": cold.prompt_tokens,
                "kept_tokens": kept.reused_tokens,
                "ttft_whole_ms": round(cold.prefill_ms, 1),
                "ttft_reused_ms": round(kept.prefill_ms, 1),
                "identical_to_whole": kept.text == cold.text,
                "identical_to_first_request": (kept.text, kept.token_logprobs)
                == (first.text, first.token_logprobs),
            }
        )
    reused = [row for row in rows if row["kept_tokens"] > 0]
    whole_ms = statistics.median(r["ttft_whole_ms"] for r in reused) if reused else None
    reused_ms = statistics.median(r["ttft_reused_ms"] for r in reused) if reused else None
    report = {
        "benchmark": "prefix-reuse",
        "command": "tabloop bench reuse " + " ".join(argv),
        "engine": reusing.describe(),
        "cpu": cpu_description(),
        "prompts": len(rows),
        "prompts_split": len(reused),
        "new_tokens": args.new_tokens,
        "baseline": "whole prompt read (completion.cache off)",
        "ttft_whole_ms_p50": whole_ms,
        "ttft_reused_ms_p50": reused_ms,
        "ttft_speedup_p50": round(whole_ms / max(reused_ms, 1e-9), 2)
        if whole_ms and reused_ms
        else None,
        "identical_to_whole": round(sum(r["identical_to_whole"] for r in rows) / len(rows), 3),
        "identical_to_first_request": round(
            sum(r["identical_to_first_request"] for r in rows) / len(rows), 3
        ),
        "cache_resets": reusing.reuse.resets,
        "cache_reset_ms_mean": round(reusing.reset_ms / max(reusing.reuse.resets, 1), 1),
        "rows": rows,
    }
    for runner in (whole, reusing, fresh):
        runner.close()
    del whole, reusing, fresh
    # Memory, each in a process of its own: one runner walking through the prompts, each asked
    # three times as typing would (with reuse: read whole, kept, served), with and without reuse.
    report["rss_mb"] = {
        mode: json.loads(
            subprocess.run(
                [sys.executable, "-m", "tabloop", "bench", "reuse", *argv, "--memory-of", mode],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for mode in ("off", "on")
    }
    print(json.dumps(report, indent=2))
    return 0


def _memory_walk(args: argparse.Namespace, *, reuse: bool) -> dict[str, Any]:
    """Resident memory of this process as one runner goes through the prompts."""
    from common.paths import default_cache_dir
    from completion.runners.ct2 import Ct2Runner
    from completion.types import CancelToken
    from evaluation.bench.engines import prompts

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    runner = Ct2Runner(args.model, cache_dir, reuse_prefix=reuse)
    loaded = _rss_mb()
    after = []
    for case in prompts(args.prompts):
        for _ in range(3):
            runner.generate(
                case["prompt"],
                max_new_tokens=args.new_tokens,
                stop=lambda _text: None,
                cancel=CancelToken(),
            )
        after.append(round(_rss_mb(), 1))
    peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "VmHWM":
            peak = int(value.split()[0]) / 1024
    runner.close()
    return {"loaded": round(loaded, 1), "after_each_prompt": after, "peak": round(peak, 1)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
