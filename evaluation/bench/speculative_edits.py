"""Speculative edits against plain greedy decoding, on next-edit rewrites of real code.

Windows of 10, 20 and 40 lines (`--lines`) are cut at random places in the top-level modules of
this machine's Python standard library, and a realistic small edit is made in each: a name
renamed at its first use in the window (the rest of its uses are what the model should rename
next), or a number or string changed on one line. The model is asked for the updated window with
the next-edit prompt (`completion.next_edit.prompt`: the edit as an original/updated block, then
the original, current and updated window), up to the window's tokens plus 32, stopping at
`<|file_sep|>`.

Each prompt runs plain (`generate`) and with the current window as the draft
(`DraftRunner.generate_with_draft`, for each draft length in `--tokens`), on one loaded runner
with its prompt reuse off so every request reads its whole prompt; the order alternates from
prompt to prompt so a change in the machine's load hits both alike. Plain greedy decoding is the
baseline.

Reported per window size: the share of requests whose output is identical (text, token count,
stop reason; the figure that must be 1.0), drafted and accepted tokens, tokens per forward pass,
decode tokens/s and the speed-up of the decode and of the whole request (p50 and total), and the
configuration loaded (engine, weights, threads, draft lengths). The torch runner checks the first
draft in the prompt's last pass (`draft_tokens_in_prompt_pass`), so its decode time leaves part
of the decoding out: its decode figures are null and the whole request is the comparison.

`--engine torch-bfloat16` is the runner next edits get beside a fast engine on a CPU with AMX or
AVX-512 BF16 (`completion.next_edit.runner`: torch in bfloat16 on every core, its own prefill
and draft sizes, its linear layers' weights packed for oneDNN); `torch-bfloat16-unpacked` is the
same runner with the weights as loaded (`completion.runners.packed`'s baseline).
`--baseline-engine E` loads a second engine and runs every prompt on it too, right after the
first engine's runs of that prompt (the order alternating), so `vs_baseline` puts the two
engines' drafted requests side by side on equal terms: same prompts, same run, the same threads
unless `--threads` is left at 0 (every core: both engines' default there).

    tabloop bench speculative-edits [--engine onnxruntime|torch|torch-bfloat16[-unpacked]]
        [--baseline-engine E] [--n 4] [--lines 10,20,40] [--tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.machine import cpu_description

SEED = 29
MARGIN_TOKENS = 32  # tokens allowed past the window's own (`completion.next_edit` settings)
MAX_LINE_CHARS = 120
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z_0-9]{2,}\b")
NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
STRING = re.compile(r"(['\"])([A-Za-z ]{2,})\1")


@dataclass(frozen=True)
class Rewrite:
    """One window of real code with one edit made in it, as the next-edit prompt shows it."""

    path: str
    start: int
    original: tuple[str, ...]  # the window before the edit
    current: tuple[str, ...]  # the window after it
    line: int  # the edited line, in the window
    kind: str  # "rename" or "change"


def _renamed(lines: list[str], rng: random.Random) -> tuple[list[str], int] | None:
    """`lines` with a name used at least twice renamed at its first use."""
    import keyword

    text = "".join(lines)
    counts: dict[str, int] = {}
    for name in IDENTIFIER.findall(text):
        counts[name] = counts.get(name, 0) + 1
    names = sorted(n for n, c in counts.items() if c >= 2 and not keyword.iskeyword(n))
    if not names:
        return None
    name = rng.choice(names)
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    for index, line in enumerate(lines):
        if pattern.search(line):
            changed = list(lines)
            changed[index] = pattern.sub(f"{name}_new", line, count=1)
            return changed, index
    return None


def _changed(lines: list[str], rng: random.Random) -> tuple[list[str], int] | None:
    """`lines` with one number made larger or one short string reworded, on one line."""
    candidates = [i for i, line in enumerate(lines) if NUMBER.search(line) or STRING.search(line)]
    if not candidates:
        return None
    index = rng.choice(candidates)
    line = lines[index]
    number = NUMBER.search(line)
    if number is not None:
        line = line[: number.start()] + str(int(number.group()) + 1) + line[number.end() :]
    else:
        line = STRING.sub(lambda m: f"{m.group(1)}{m.group(2)} now{m.group(1)}", line, count=1)
    changed = list(lines)
    changed[index] = line
    return changed, index


def sample_rewrites(size: int, n: int, rng: random.Random) -> list[Rewrite]:
    """`n` windows of `size` lines from the standard library, each with one edit made."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size < 200_000)
    found: list[Rewrite] = []
    while len(found) < n:
        path = rng.choice(files)
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(lines) < size:
            continue
        start = rng.randrange(len(lines) - size + 1)
        window = lines[start : start + size]
        if sum(1 for line in window if line.strip()) < size // 2:
            continue
        if any(len(line) > MAX_LINE_CHARS for line in window):
            continue
        kind = "rename" if len(found) % 2 == 0 else "change"
        edit = (_renamed if kind == "rename" else _changed)(window, rng)
        if edit is None:
            continue
        current, line = edit
        found.append(Rewrite(path.name, start, tuple(window), tuple(current), line, kind))
    return found


def prompt_for(rewrite: Rewrite) -> str:
    """The next-edit prompt of `rewrite` (`completion.next_edit.prompt`)."""
    from completion.next_edit.history import EditEvent
    from completion.next_edit.prompt import Window, build_prompt, render_event

    line = rewrite.start + rewrite.line
    event = EditEvent(
        path=rewrite.path,
        start=line,
        original=(rewrite.original[rewrite.line],),
        updated=(rewrite.current[rewrite.line],),
        first_at=0.0,
        last_at=0.0,
    )
    window = Window(rewrite.start, rewrite.current)
    return build_prompt(rewrite.path, [render_event(event)], "".join(rewrite.original), window)


def stop_at_file_sep(text: str) -> int | None:
    """Where the rewrite ends: its `<|file_sep|>` (or end of text)."""
    from completion.next_edit.prompt import FILE_SEP

    found = [i for mark in (FILE_SEP, "<|endoftext|>") if (i := text.find(mark)) >= 0]
    return min(found) if found else None


def _run(runner: Any, prompt: str, draft: str | None, max_new_tokens: int) -> dict[str, Any]:
    from completion.types import CancelToken

    started = time.perf_counter()
    if draft is None:
        generation = runner.generate(
            prompt, max_new_tokens=max_new_tokens, stop=stop_at_file_sep, cancel=CancelToken()
        )
    else:
        generation = runner.generate_with_draft(
            prompt,
            draft=draft,
            max_new_tokens=max_new_tokens,
            stop=stop_at_file_sep,
            cancel=CancelToken(),
        )
    return {"request_ms": (time.perf_counter() - started) * 1000, "generation": generation}


def _configuration(runner: Any) -> dict[str, Any]:
    """What was loaded: engine, weights, threads."""
    from completion.runners.onnx import OnnxRunner

    if isinstance(runner, OnnxRunner):
        return runner.describe()
    import torch

    from completion.runners.torch_runner import MIN_EDIT_DRAFT_TOKENS

    return {
        "engine": "torch",
        "engine_version": torch.__version__,
        "compute_type": str(runner.dtype),
        "threads": torch.get_num_threads(),
        # Linear layers whose weights are packed for oneDNN (`completion.runners.packed`).
        "packed_linears": runner.packed_linears,
        "prefill_chunk_tokens": runner.prefill_chunk_tokens,
        # Speculative edits: the most draft tokens a pass checks (the first draft in the prompt's
        # last pass), after a mismatch twice the agreed part, at least the minimum.
        "edit_draft_tokens_max": runner.edit_draft_tokens,
        "edit_draft_tokens_min": MIN_EDIT_DRAFT_TOKENS,
    }


ENGINES = ("onnxruntime", "torch", "torch-bfloat16", "torch-bfloat16-unpacked")


def _load(engine: str, model: str, threads: int, cache_dir: Path) -> Any:
    """The runner `engine` names, with its prompt reuse off."""
    from completion.next_edit.runner import load_next_edit_runner
    from completion.runners import load_runner
    from completion.runners.onnx import OnnxRunner
    from completion.runners.torch_runner import TorchRunner
    from completion.settings import CompletionSettings

    if engine.startswith("torch-bfloat16"):
        settings = CompletionSettings(model=model, threads=threads, cache=False)
        packed = engine == "torch-bfloat16"
        runner: Any = load_next_edit_runner(settings, cache_dir, pack_weights=packed)
    else:
        settings = CompletionSettings(model=model, engine=engine, threads=threads, cache=False)
        runner = load_runner(settings, cache_dir)
    if not isinstance(runner, OnnxRunner | TorchRunner):  # the runners that check drafts
        raise SystemExit(f"tabloop bench speculative-edits: {engine} cannot check drafts")
    return runner


def main(argv: list[str]) -> int:
    """Run every rewrite plain and drafted and print one JSON report."""
    parser = argparse.ArgumentParser(prog="tabloop bench speculative-edits", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--engine", default="onnxruntime", choices=ENGINES)
    parser.add_argument("--baseline-engine", default="", choices=["", *ENGINES])
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--n", type=int, default=4, help="rewrites per window size")
    parser.add_argument("--lines", default="10,20,40", help="window sizes in lines")
    parser.add_argument("--tokens", default="", help="draft tokens per pass, comma-separated")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)

    from common.paths import default_cache_dir
    from evaluation.bench.speculative import _summary

    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    names = [args.engine] + ([args.baseline_engine] if args.baseline_engine else [])
    if len(set(names)) < len(names):
        raise SystemExit("tabloop bench speculative-edits: the baseline is the same engine")
    runners = {name: _load(name, args.model, args.threads, cache_dir) for name in names}
    # As loaded: `--tokens` changes the draft length per run (the keys of `by_draft_tokens`).
    configurations = {name: _configuration(runner) for name, runner in runners.items()}
    asked = [int(k) for k in args.tokens.split(",") if k]
    lengths = {name: asked or [r.edit_draft_tokens] for name, r in runners.items()}
    sizes = [int(size) for size in args.lines.split(",") if size]
    rng = random.Random(args.seed)

    by_engine: dict[str, dict[str, Any]] = {name: {} for name in names}
    done = 0
    for size in sizes:
        rewrites = sample_rewrites(size, args.n, rng)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {
            name: {mode: [] for mode in [0, *lengths[name]]} for name in names
        }
        for index, rewrite in enumerate(rewrites):
            prompt, draft = prompt_for(rewrite), "".join(rewrite.current)
            for name in names if index % 2 == 0 else names[::-1]:
                runner = runners[name]
                max_new_tokens = runner.count_tokens(draft) + MARGIN_TOKENS
                modes = list(runs[name])  # 0: plain
                for mode in modes if index % 2 == 0 else modes[::-1]:
                    runner.edit_draft_tokens = max(mode, 1)
                    found = _run(runner, prompt, draft if mode else None, max_new_tokens)
                    runs[name][mode].append(found)
            done += 1
            print(f"\r{done}/{len(sizes) * args.n}", end="", file=sys.stderr, flush=True)
        for name, runner in runners.items():
            by_engine[name][str(size)] = _size_report(
                runner, rewrites, runs[name], lengths[name], _summary
            )
    print(file=sys.stderr)
    first = runners[args.engine]
    report = {
        "benchmark": "speculative-edits",
        "command": "tabloop bench speculative-edits " + " ".join(argv),
        "model_id": first.model_id,
        "configuration": configurations[args.engine],
        "cpu": cpu_description(),
        "load_average": round(os.getloadavg()[0], 2),
        "baseline": "plain greedy decoding (generate) of the same prompts, same runner",
        "by_window_lines": by_engine[args.engine],
    }
    if args.baseline_engine:
        other = runners[args.baseline_engine]
        report["baseline_engine"] = {
            "name": args.baseline_engine,
            "model_id": other.model_id,
            "configuration": configurations[args.baseline_engine],
            "by_window_lines": by_engine[args.baseline_engine],
        }
        report["vs_baseline"] = {
            size: _versus(by_engine[args.engine][size], by_engine[args.baseline_engine][size])
            for size in by_engine[args.engine]
        }
    for runner in runners.values():
        runner.close()
    print(json.dumps(report, indent=2))
    return 0


def _versus(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """The engine's drafted requests against the baseline engine's, same prompts: each at its
    own draft length (the first of `--tokens`)."""
    mine = next(iter(ours["by_draft_tokens"].values()))
    base = next(iter(theirs["by_draft_tokens"].values()))
    return {
        "request_ms_p50": mine["request_ms_p50"],
        "request_ms_p50_baseline": base["request_ms_p50"],
        "request_speedup_p50": round(base["request_ms_p50"] / mine["request_ms_p50"], 3),
        "prompt_tokens_p50": ours["prompt_tokens_p50"],
    }


def _size_report(
    runner: Any,
    rewrites: list[Rewrite],
    runs: dict[int, list[dict[str, Any]]],
    lengths: list[int],
    summary: Any,
) -> dict[str, Any]:
    """One engine's figures for one window size."""
    plain = runs[0]
    outputs = [a["generation"].text for a in plain]
    return {
        "rewrites": len(rewrites),
        "kinds": [r.kind for r in rewrites],
        "window_tokens_p50": statistics.median(
            runner.count_tokens("".join(r.current)) for r in rewrites
        ),
        "prompt_tokens_p50": statistics.median(a["generation"].prompt_tokens for a in plain),
        "new_tokens_total": sum(a["generation"].new_tokens for a in plain),
        # How the model answered: the current window copied, or changed.
        "outputs_equal_to_window": sum(
            out == "".join(r.current) for out, r in zip(outputs, rewrites, strict=True)
        ),
        "by_draft_tokens": {str(k): summary(plain, runs[k]) for k in lengths},
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
