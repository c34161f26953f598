"""What the syntax check in place costs per keystroke, with and without the document's last tree.

A user types a line of a real file again, one character at a time; after each keystroke the
check runs on a suggestion (the rest of the true line and the line after it), as the server does
before it shows one. Measured on the same keystrokes and suggestions:

- `from_nothing` (the baseline): every check parses the whole file first;
- `from_last_tree` (the server's path): the checker re-parses from the document's last tree
  (`completion.syntax`), so a keystroke costs an incremental parse;

with the check's time p50/p95/max and the share of verdicts that are identical (it must be 1).

    tabloop bench syntax [--corpus DIR] [--files 12] [--lines 3] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Any


def _sample_lines(source: str, lines: int, rng: random.Random) -> list[tuple[int, str]]:
    """(offset of the line's start, the line and the next one) for lines worth typing."""
    starts = [0]
    for index, char in enumerate(source):
        if char == "\n":
            starts.append(index + 1)
    candidates = []
    for number in range(len(starts) - 2):
        line = source[starts[number] : starts[number + 1] - 1]
        if len(line.strip()) >= 12 and not line.lstrip().startswith("#"):
            candidates.append((starts[number], source[starts[number] : starts[number + 2] - 1]))
    return rng.sample(candidates, min(lines, len(candidates)))


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
        "max": round(ordered[-1], 3),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench syntax", description=__doc__)
    parser.add_argument("--corpus", default=sysconfig.get_paths()["stdlib"])
    parser.add_argument("--files", type=int, default=12, help="files to type in")
    parser.add_argument("--lines", type=int, default=3, help="lines typed again per file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)

    from completion.syntax import SyntaxChecker
    from completion.types import CompletionRequest

    rng = random.Random(args.seed)
    files = sorted(
        path for path in Path(args.corpus).glob("*.py") if 20_000 <= path.stat().st_size <= 400_000
    )
    chosen = rng.sample(files, min(args.files, len(files)))
    cold = SyntaxChecker()
    times: dict[str, list[float]] = {"from_nothing": [], "from_last_tree": []}
    identical = keystrokes = 0
    outcomes: dict[str, int] = {}
    sizes = []
    for path in chosen:
        source = path.read_text(encoding="utf-8", errors="replace")
        sizes.append(len(source.encode()))
        warm = SyntaxChecker()  # a fresh server for each file: its first check parses in full
        for start, truth in _sample_lines(source, args.lines, rng):
            line_end = source.index("\n", start)
            suffix = source[line_end:]
            line = source[start:line_end]
            for typed in range(len(line) - len(line.lstrip()), len(line)):
                request = CompletionRequest(
                    prefix=source[:start] + line[:typed],
                    suffix=suffix,
                    language="python",
                    uri=path.as_uri(),
                )
                suggestion = truth[typed:]
                kept = warm.check(request, suggestion)
                baseline = cold.check(
                    CompletionRequest(request.prefix, request.suffix, "python"), suggestion
                )
                keystrokes += 1
                identical += (kept.text, kept.outcome) == (baseline.text, baseline.outcome)
                outcomes[kept.outcome] = outcomes.get(kept.outcome, 0) + 1
                times["from_last_tree"].append(kept.ms)
                times["from_nothing"].append(baseline.ms)
    summary: dict[str, Any] = {name: _percentiles(values) for name, values in times.items()}
    result = {
        "benchmark": "syntax",
        "command": "tabloop bench syntax " + " ".join(argv),
        "corpus": args.corpus,
        "files": len(chosen),
        "file_bytes_p50": int(statistics.median(sizes)) if sizes else 0,
        "keystrokes": keystrokes,
        "baseline": "from_nothing",
        "check_ms": summary,
        "speedup_p50": round(
            summary["from_nothing"]["p50"] / max(summary["from_last_tree"]["p50"], 1e-9), 2
        )
        if keystrokes
        else None,
        "identical_verdicts": round(identical / keystrokes, 4) if keystrokes else None,
        "outcomes": outcomes,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
