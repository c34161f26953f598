"""Speculative decoding with the code as the draft against plain greedy decoding, same requests.

Fill-in-the-middle prompts are cut at sampled places in real standard-library files (the
`eval holes` sampler) and assembled as the engine assembles them (token budget, Qwen template,
the engine's stop rule). One process, one loaded model, the KV-prefix cache off so every request
prefills its whole prompt; each prompt runs plain and speculative in turn, the order alternating
from prompt to prompt so a change in the machine's load hits both alike. Plain greedy decoding is
the baseline.

Reported: the share of requests whose output is identical (text, token count, stop reason), the
draft tokens proposed and accepted per verification pass, tokens per decode forward pass, decode
tokens/s, and the speed-up (plain time / speculative time) of the decode and of the whole request,
per request (p50) and in total; for each draft length in `--tokens`.

    tabloop bench speculative [--model bundled] [--n 20] [--tokens 8,16] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

SEED = 13


def _holes(n: int, seed: int) -> list[Any]:
    """`n` holes in the top-level standard-library modules (the `eval holes` sampler)."""
    from evaluation.holes import MAX_FILE_BYTES, sample_holes
    from evaluation.positions import select_files

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in select_files(stdlib, {".py"}, MAX_FILE_BYTES) if p.parent == stdlib]
    return sample_holes(files, n, random.Random(seed))


def _measure(runner: Any, prompt: str, request: Any, max_new_tokens: int) -> dict[str, Any]:
    from completion.postprocess import stop_rule
    from completion.types import CancelToken

    started = time.perf_counter()
    generation = runner.generate(
        prompt, max_new_tokens=max_new_tokens, stop=stop_rule(request), cancel=CancelToken()
    )
    return {
        "request_ms": (time.perf_counter() - started) * 1000,
        "generation": generation,
    }


def _summary(plain: list[dict[str, Any]], spec: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one speculative configuration against the plain runs of the same prompts."""
    same = [
        a["generation"].text == b["generation"].text
        and a["generation"].new_tokens == b["generation"].new_tokens
        and a["generation"].stop_reason == b["generation"].stop_reason
        for a, b in zip(plain, spec, strict=True)
    ]
    gens = [b["generation"] for b in spec]
    drafted = sum(g.draft_tokens for g in gens)
    accepted = sum(g.draft_accepted for g in gens)
    steps = sum(g.verify_steps for g in gens)
    plain_gens = [a["generation"] for a in plain]

    def tokens_per_pass(items: list[Any]) -> float:
        # The prefill's last pass gives the first token; each decode pass gives the rest.
        passes = sum(g.decode_passes + 1 for g in items if g.new_tokens)
        return round(sum(g.new_tokens for g in items) / max(passes, 1), 3)

    def decode_tok_s(items: list[Any]) -> float:
        return round(sum(g.new_tokens for g in items) / (sum(g.decode_ms for g in items) / 1000), 2)

    decode_speedups = [
        a["generation"].decode_ms / b["generation"].decode_ms
        for a, b in zip(plain, spec, strict=True)
        if a["generation"].new_tokens > 1 and b["generation"].decode_ms > 0
    ]
    # A runner that checks the first draft in the prompt's last pass has part of its decoding in
    # `prefill_ms`: its decode times would flatter it, so only whole requests are compared.
    in_prompt_pass = sum(g.prompt_pass_draft_tokens for g in gens)
    request_speedups = [a["request_ms"] / b["request_ms"] for a, b in zip(plain, spec, strict=True)]
    return {
        "identical_share": round(sum(same) / len(same), 3),
        "requests_with_a_draft": sum(1 for g in gens if g.verify_steps),
        "draft_tokens": drafted,
        "draft_accepted": accepted,
        "verify_steps": steps,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "accepted_per_verify_step": round(accepted / steps, 3) if steps else 0.0,
        "tokens_per_forward_pass": tokens_per_pass(gens),
        "tokens_per_forward_pass_plain": tokens_per_pass(plain_gens),
        "draft_tokens_in_prompt_pass": in_prompt_pass,
        "decode_tok_s": None if in_prompt_pass else decode_tok_s(gens),
        "decode_tok_s_plain": decode_tok_s(plain_gens),
        # None when no request decoded more than one token, or decoding began in the prompt pass.
        "decode_speedup_p50": (
            round(statistics.median(decode_speedups), 3)
            if decode_speedups and not in_prompt_pass
            else None
        ),
        "decode_speedup_total": None
        if in_prompt_pass
        else round(sum(g.decode_ms for g in plain_gens) / sum(g.decode_ms for g in gens), 3),
        "request_speedup_p50": round(statistics.median(request_speedups), 3),
        "request_speedup_total": round(
            sum(a["request_ms"] for a in plain) / sum(b["request_ms"] for b in spec), 3
        ),
        "request_ms_p50": round(statistics.median(b["request_ms"] for b in spec), 1),
        "request_ms_p50_plain": round(statistics.median(a["request_ms"] for a in plain), 1),
        "differing": [
            {"prompt": index, "plain": a["generation"].text, "speculative": b["generation"].text}
            for index, (a, b, ok) in enumerate(zip(plain, spec, same, strict=True))
            if not ok
        ],
    }


def main(argv: list[str]) -> int:
    """Run every prompt plain and speculative and print one JSON report."""
    parser = argparse.ArgumentParser(prog="tabloop bench speculative", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--n", type=int, default=20, help="prompts")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--tokens", default="", help="draft lengths to measure, comma-separated")
    parser.add_argument("--ngram", type=int, default=0, help="longest n-gram the drafter matches")
    parser.add_argument("--min-ngram", type=int, default=0, help="shortest n-gram it matches")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--context-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)

    from common.paths import default_cache_dir
    from completion.context import ContextBudget, LineTokenCounter, assemble
    from completion.fim import template_for
    from completion.runners.torch_runner import (
        DEFAULT_DRAFT_MIN_NGRAM,
        DEFAULT_DRAFT_NGRAM,
        DEFAULT_DRAFT_TOKENS,
        TorchRunner,
        default_threads,
    )
    from completion.settings import CompletionSettings

    lengths = [int(k) for k in args.tokens.split(",") if k] or [DEFAULT_DRAFT_TOKENS]
    args.ngram = args.ngram or DEFAULT_DRAFT_NGRAM
    args.min_ngram = args.min_ngram or DEFAULT_DRAFT_MIN_NGRAM
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    runner = TorchRunner(
        args.model,
        cache_dir,
        dtype="float32",
        threads=args.threads,
        reuse_cache=False,
        draft_ngram=args.ngram,
        draft_min_ngram=args.min_ngram,
    )
    template = template_for(runner.family)
    budget = ContextBudget.from_settings(CompletionSettings(context_tokens=args.context_tokens))
    counter = LineTokenCounter(runner.count_tokens)
    prompts = []
    for hole in _holes(args.n, args.seed):
        request = hole.request()
        parts = assemble(request, budget, count_tokens=counter)
        prompts.append((template.build(parts.prefix, parts.suffix), request))

    modes: list[int] = [0, *lengths]  # 0: plain
    runs: dict[int, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for index, (prompt, request) in enumerate(prompts):
        order = modes if index % 2 == 0 else modes[::-1]
        for mode in order:
            runner.speculative = mode > 0
            runner.speculative_tokens = max(mode, 1)
            runs[mode].append(_measure(runner, prompt, request, args.max_new_tokens))
        print(f"\r{index + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    plain = runs[0]
    report = {
        "benchmark": "speculative",
        "command": "tabloop bench speculative " + " ".join(argv),
        "model_id": runner.model_id,
        "threads": args.threads or default_threads(),
        "load_average": round(os.getloadavg()[0], 2),
        "prompts": len(prompts),
        "prompt_tokens_p50": statistics.median(a["generation"].prompt_tokens for a in plain),
        "new_tokens_total": sum(a["generation"].new_tokens for a in plain),
        "max_new_tokens": args.max_new_tokens,
        "draft_ngram": [args.min_ngram, args.ngram],
        "baseline": "plain greedy decoding",
        "by_draft_tokens": {str(k): _summary(plain, runs[k]) for k in lengths},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
