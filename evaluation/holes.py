"""`tabloop eval holes`: how good the suggestions are on real code, with and without retrieval.

Positions are sampled in real files. At each, the rest of the line is hidden (a *line* hole) or,
for a share of them at the start of a statement inside a block, the rest of the block (a *block*
hole); the engine completes the hole from the text before and after it. Both runs, without and
with snippets from a semantic index of the corpus, see the same holes.

Reported per run: `exact_line_match` (the first line is exactly right) and its standard error,
`edit_similarity` (1 - Levenshtein distance / longer length, between suggestion and truth),
`parses` (Python files still parse with the suggestion in place; `parses_if_left_empty` with
nothing inserted), `latency_ms_p50`/`p95` (the engine's time when the model ran, syntax check
included; model outputs are cached by prompt, so a rerun costs little and keeps the latency of the
first run), `context_ms` (gathering context: retrieval's time), `prompts_with_snippets` (the share
of prompts that held code from other files), `mid_word_holes` (holes that cut a word: the prefix
ends with a word character and so does the truth's start), `mid_word_ignores_partial` (the share
of them whose suggestion starts a new token instead of completing the word) and
`mid_word_ignores_unknown_partial` (the same, counting only holes where the typed part is not a
whole name anywhere else in the file: after `name` with `name = ...` a line above, ending the word
is a reading of what was typed, not a failure to see it; after `isinst` it is the failure). With
`completion.syntaxCheck` on, `syntax_check` gives what the check did (`outcomes`, `changed`), its
time (`ms`), and the figures of the same suggestions before it (`without_check`).
`--healing-baseline` completes the mid-word holes once more without token healing (in the run
without retrieval) and reports both. `--set key=value` changes a completion setting for the run
(e.g. `snippet_min_similarity=0.7`). `--against key=value` completes the same holes once more with
that setting changed and reports that run beside this one, with `paired`: the per-hole differences
(this run's minus the other's) of exact-line match and edit similarity, their standard errors, and
how many holes got another suggestion; this is how a default is chosen.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.languages import request_language
from completion.context import ContextSource
from completion.types import CompletionRequest
from evaluation.positions import (
    Cursor,
    Draw,
    LineOrBlock,
    read_sources,
    sample_cursors,
    select_files,
)
from indexer.languages import EXTENSIONS
from lsp_server import config

BLOCK_SHARE = 0.25
_WORD_END = re.compile(r"\w$")
_WORD_START = re.compile(r"\w")
_LAST_WORD = re.compile(r"\w+$")
MAX_FILE_BYTES = 300_000


@dataclass(frozen=True)
class Hole:
    path: Path
    prefix: str
    truth: str
    suffix: str
    kind: str  # "line" or "block"
    line: int
    character: int

    def request(self) -> CompletionRequest:
        return CompletionRequest(
            prefix=self.prefix,
            suffix=self.suffix,
            language=request_language(None, str(self.path)),
            path=str(self.path),
            uri=self.path.as_uri(),
            trigger="invoked",
            line=self.line,
            character=self.character,
        )


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), in O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        previous = current
    return previous[-1]


def edit_similarity(suggestion: str, truth: str) -> float:
    """1 - distance / longer length; 1.0 for two empty strings."""
    longest = max(len(suggestion), len(truth))
    return 1.0 if longest == 0 else 1.0 - levenshtein(suggestion, truth) / longest


def _block_end(lines: list[str], start: int) -> int:
    """Index after the last line of the block holding line `start` (by indentation)."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def sample_holes(files: Sequence[Path], n: int, rng: random.Random) -> list[Hole]:
    """`n` holes spread over `files`, the same for the same seed."""
    cursors = sample_cursors(
        read_sources(files), n, rng, LineOrBlock(block_share=BLOCK_SHARE), Draw.SAMPLE_THEN_PLACE
    )
    return [_hole(cursor) for cursor in cursors]


def _hole(cursor: Cursor) -> Hole:
    """The hole a cursor makes: the rest of its line, or (a block cursor) of its block."""
    path, lines = cursor.source.path, cursor.source.lines
    number, line, column = cursor.line.number, cursor.line.text, cursor.column
    before = cursor.source.text[: cursor.line.start]
    if cursor.kind == "block":
        end = _block_end(lines, number)
        truth = "".join(lines[number:end])[column:].rstrip("\n")
        suffix = "\n" + "".join(lines[end:]) if end < len(lines) else ""
        return Hole(path, before + line[:column], truth, suffix, "block", number, column)
    content = line.rstrip("\r\n")
    ending = line[len(content) :]
    return Hole(
        path,
        before + content[:column],
        content[column:],
        ending + "".join(lines[number + 1 :]),
        "line",
        number,
        column,
    )


def parses(hole: Hole, suggestion: str) -> bool | None:
    """Whether a Python file parses with the suggestion in place (None for other languages)."""
    if hole.path.suffix != ".py":
        return None
    try:
        ast.parse(hole.prefix + suggestion + hole.suffix)
    except (SyntaxError, ValueError):
        return False
    return True


def mid_word(hole: Hole) -> bool:
    """Whether the hole cuts a word in two: the user has typed part of it."""
    return bool(_WORD_END.search(hole.prefix)) and bool(_WORD_START.match(hole.truth))


def ignores_partial(suggestion: str) -> bool:
    """Whether a suggestion at a mid-word cursor starts a new token instead of completing the
    word (`if isinst` + ` instream`): it is not empty and does not start with a word character."""
    return bool(suggestion) and not _WORD_START.match(suggestion)


def typed_word_is_a_name(hole: Hole) -> bool:
    """Whether the word typed before a mid-word cursor is, as it stands, a whole name found
    elsewhere in the file (before it or after the hole)."""
    found = _LAST_WORD.search(hole.prefix)
    if found is None:
        return False
    name = re.compile(rf"(?<!\w){re.escape(found.group())}(?!\w)")
    return bool(name.search(hole.prefix, 0, found.start()) or name.search(hole.suffix))


def ignores_unknown_partial(hole: Hole, suggestion: str) -> bool:
    """`ignores_partial` where the typed part cannot be read as a complete name."""
    return ignores_partial(suggestion) and not typed_word_is_a_name(hole)


def _share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": round(statistics.median(values), 2) if values else None,
        "p95": round(statistics.quantiles(values, n=20, method="inclusive")[-1], 2)
        if len(values) > 1
        else None,
    }


def exact_line(hole: Hole, suggestion: str) -> bool:
    """The suggestion's first line is the truth's first line (blanks around them aside)."""
    return suggestion.split("\n", 1)[0].strip() == hole.truth.split("\n", 1)[0].strip()


def similarity(hole: Hole, suggestion: str) -> float:
    """Edit similarity to the truth: the whole suggestion for a block hole, else its first line."""
    return edit_similarity(
        suggestion if hole.kind == "block" else suggestion.split("\n", 1)[0], hole.truth
    )


def _mean_and_stderr(differences: Sequence[float]) -> dict[str, float]:
    mean = statistics.fmean(differences)
    spread = statistics.stdev(differences) if len(differences) > 1 else 0.0
    return {"mean": round(mean, 4), "stderr": round(spread / math.sqrt(len(differences)), 4)}


def paired(holes: Sequence[Hole], ours: Sequence[str], theirs: Sequence[str]) -> dict[str, Any]:
    """Per-hole differences (ours - theirs) on the same holes, with their standard errors: a
    paired comparison separates two settings with far fewer holes than two separate means."""
    rows = list(zip(holes, ours, theirs, strict=True))
    return {
        "n": len(rows),
        "exact_line_match": _mean_and_stderr(
            [float(exact_line(h, a)) - float(exact_line(h, b)) for h, a, b in rows]
        ),
        "edit_similarity": _mean_and_stderr(
            [similarity(h, a) - similarity(h, b) for h, a, b in rows]
        ),
        "holes_differing": sum(1 for _, a, b in rows if a != b),
    }


def score(
    holes: Sequence[Hole], suggestions: Sequence[str], latencies: Sequence[float]
) -> dict[str, Any]:
    exact = [exact_line(h, s) for h, s in zip(holes, suggestions, strict=True)]
    similarities = [similarity(h, s) for h, s in zip(holes, suggestions, strict=True)]
    parsed = [p for h, s in zip(holes, suggestions, strict=True) if (p := parses(h, s)) is not None]
    # Baseline for `parses`: the file with nothing inserted (a hole often leaves it broken).
    parsed_empty = [p for h in holes if (p := parses(h, "")) is not None]
    return {
        "n": len(holes),
        "exact_line_match": round(sum(exact) / len(holes), 4),
        "edit_similarity": round(statistics.fmean(similarities), 4),
        "parses": round(sum(parsed) / len(parsed), 4) if parsed else None,
        "parses_if_left_empty": round(sum(parsed_empty) / len(parsed_empty), 4)
        if parsed_empty
        else None,
        "empty_suggestions": sum(1 for s in suggestions if not s),
        "mid_word_holes": sum(1 for h in holes if mid_word(h)),
        "mid_word_ignores_partial": _share(
            [ignores_partial(s) for h, s in zip(holes, suggestions, strict=True) if mid_word(h)]
        ),
        "mid_word_ignores_unknown_partial": _share(
            [
                ignores_unknown_partial(h, s)
                for h, s in zip(holes, suggestions, strict=True)
                if mid_word(h)
            ]
        ),
        "exact_line_match_stderr": round(
            math.sqrt(
                max(0.0, statistics.fmean(exact) * (1 - statistics.fmean(exact))) / len(exact)
            ),
            4,
        ),
        "latency_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "latency_ms_p95": round(statistics.quantiles(latencies, n=20, method="inclusive")[-1], 1)
        if len(latencies) > 1
        else None,
    }


def corpus_files(root: Path) -> list[Path]:
    """Files of every language the index knows, up to `MAX_FILE_BYTES`, sorted by path."""
    return select_files(root, EXTENSIONS, MAX_FILE_BYTES)


def run_holes(args: argparse.Namespace) -> dict[str, Any]:
    from completion.output_cache import CachedRunner
    from completion.runners import load_runner

    corpus = Path(args.corpus).resolve()
    resolved = config.resolve(corpus)
    settings = resolved.settings
    completion = settings.completion.model_copy(
        update={
            "max_new_tokens": args.max_new_tokens,
            # Quality, not latency, is measured: retrieval always gets to finish, so a busy
            # machine cannot change which snippets a prompt holds.
            "context_timeout_ms": 60_000,
            **({"model": args.model} if args.model else {}),
        }
    )
    if args.set:
        try:
            completion = type(completion).model_validate(
                {**completion.model_dump(), **setting_overrides(args.set)}
            )
        except ValidationError as error:
            raise SystemExit(f"--set: {error}") from None
    engines = [e for e in args.engines.split(",") if e] or [completion.engine]
    if args.against and len(engines) > 1:
        raise SystemExit("--against compares settings of one engine; leave out --engines")
    cache_dir = settings.cache_path()
    holes = sample_holes(corpus_files(corpus), args.n, random.Random(args.seed))
    if not holes:
        raise SystemExit(f"no source files with code lines under {corpus}")
    results: dict[str, Any] = {
        "command": "tabloop eval holes " + " ".join(args.argv),
        "corpus": str(corpus),
        "seed": args.seed,
    }
    index = None
    try:
        sources: list[tuple[str, ContextSource | None]] = [("without_retrieval", None)]
        if not args.no_retrieval:
            index, context = corpus_context(corpus, settings, cache_dir)
            sources.append(("with_retrieval", context))
        for number, engine_name in enumerate(engines):
            settings_for = completion.model_copy(update={"engine": engine_name})
            runner = CachedRunner(
                load_runner(settings_for, cache_dir), cache_dir / "eval" / "outputs.jsonl"
            )
            # The engines after the first (the baselines) may run on the first holes only.
            these = holes[: args.baseline_n] if number and args.baseline_n else holes
            found: dict[str, Any] = {"model": runner.model_id}
            try:
                for name, source in sources:
                    found[name] = _complete_holes(
                        settings_for,
                        runner,
                        source,
                        these,
                        f"{engine_name} {name}",
                        healing_baseline=args.healing_baseline and source is None,
                    )
                found["model_runs"] = runner.misses
                found["cached_outputs_used"] = runner.hits
            finally:
                runner.close()
            if len(engines) == 1:
                results.update(found)
            else:
                results[engine_name] = found
        if args.against:
            results["against"] = _against(args, completion, cache_dir, sources, holes, results)
        if len(engines) > 1 and args.baseline_n:
            # The new default on exactly the baseline's holes, for a like-for-like comparison.
            first = engines[0]
            results[first]["on_baseline_holes"] = {
                name: _rescore(results[first], name, holes, args.baseline_n) for name, _ in sources
            }
    finally:
        if index is not None:
            index.close()
    _drop_suggestions(results)
    return results


def _against(
    args: argparse.Namespace,
    completion: Any,
    cache_dir: Path,
    sources: Sequence[tuple[str, ContextSource | None]],
    holes: Sequence[Hole],
    results: dict[str, Any],
) -> dict[str, Any]:
    """The same holes with `--against` settings, scored alone and paired with the run's own."""
    from completion.output_cache import CachedRunner
    from completion.runners import load_runner

    try:
        other = type(completion).model_validate(
            {**completion.model_dump(), **setting_overrides(args.against)}
        )
    except ValidationError as error:
        raise SystemExit(f"--against: {error}") from None
    runner = CachedRunner(load_runner(other, cache_dir), cache_dir / "eval" / "outputs.jsonl")
    found: dict[str, Any] = {"settings": setting_overrides(args.against), "model": runner.model_id}
    try:
        for name, source in sources:
            theirs = _complete_holes(other, runner, source, holes, f"against {name}")
            found[name] = {
                **theirs,
                "paired": paired(holes, results[name]["suggestions"], theirs["suggestions"]),
            }
        found["model_runs"] = runner.misses
        found["cached_outputs_used"] = runner.hits
    finally:
        runner.close()
    return found


def setting_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set key=value` pairs as completion settings (values read as JSON, else as text)."""
    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set wants KEY=VALUE, got {pair!r}")
        try:
            found[key.strip()] = json.loads(value)
        except ValueError:
            found[key.strip()] = value
    return found


def _drop_suggestions(found: dict[str, Any]) -> None:
    """The report keeps figures; the suggestions were kept only to score subsets."""
    found.pop("suggestions", None)
    for value in found.values():
        if isinstance(value, dict):
            _drop_suggestions(value)


def _complete_holes(
    completion: Any,
    runner: Any,
    source: ContextSource | None,
    holes: Sequence[Hole],
    label: str,
    healing_baseline: bool = False,
) -> dict[str, Any]:
    """Complete every hole; score the suggestions as shown (after the syntax check when it is
    on) and report what the check changed, its time, the context's time, and (with
    `healing_baseline`) the mid-word holes again without token healing."""
    from completion.engine import Engine
    from completion.types import Timings

    checking = bool(completion.syntax_check)
    # The engine runs without the check so that the suggestion before it is known; the check is
    # then the engine's own (`Engine.check_syntax`), as it runs when serving.
    engine = Engine(
        completion.model_copy(update={"syntax_check": False}), runner, context_source=source
    )
    checker = Engine(completion, runner)
    suggestions, unchecked, latencies, context_ms, syntax_ms = [], [], [], [], []
    with_snippets: list[bool] = []
    outcomes: dict[str, int] = {}
    for number, hole in enumerate(holes, 1):
        request = hole.request()
        decision = engine.complete(request)
        text = decision.text
        unchecked.append(text)
        with_snippets.append(bool(decision.features.get("retrieval_found")))
        timings = Timings()
        if checking:
            text, outcome = checker.check_syntax(request, text, timings)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome != "unchecked":
                syntax_ms.append(timings.syntax_ms)
        suggestions.append(text)
        generation = decision.generation
        if generation is not None:
            context_ms.append(decision.timings.context_ms)
            latencies.append(
                decision.timings.context_ms
                + generation.prefill_ms
                + generation.decode_ms
                + timings.syntax_ms
            )
        print(f"\r{label}: {number}/{len(holes)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    scored = score(holes, suggestions, latencies)
    scored["context_ms"] = _quantiles(context_ms)
    scored["prompts_with_snippets"] = _share(with_snippets)
    scored["token_healing"] = bool(completion.token_healing)
    if checking:
        before = score(holes, unchecked, [])
        scored["syntax_check"] = {
            "outcomes": dict(sorted(outcomes.items())),
            "changed": sum(1 for a, b in zip(suggestions, unchecked, strict=True) if a != b),
            "ms": _quantiles(syntax_ms),
            "without_check": {
                key: before[key]
                for key in ("exact_line_match", "edit_similarity", "parses", "empty_suggestions")
            },
        }
    if healing_baseline and completion.token_healing:
        cut = [h for h in holes if mid_word(h)]
        plain = Engine(
            completion.model_copy(update={"token_healing": False, "syntax_check": False}),
            runner,
            context_source=source,
        )
        texts = []
        for number, hole in enumerate(cut, 1):
            texts.append(plain.complete(hole.request()).text)
            print(
                f"\r{label} mid-word, no healing: {number}/{len(cut)}",
                end="",
                file=sys.stderr,
                flush=True,
            )
        print(file=sys.stderr)
        scored["without_token_healing_on_mid_word_holes"] = {
            "n": len(cut),
            "mid_word_ignores_partial": _share([ignores_partial(t) for t in texts]),
            "mid_word_ignores_unknown_partial": _share(
                [ignores_unknown_partial(h, t) for h, t in zip(cut, texts, strict=True)]
            ),
            "exact_line_match": _share([exact_line(h, t) for h, t in zip(cut, texts, strict=True)]),
            "with_token_healing_exact_line_match": _share(
                [exact_line(h, s) for h, s in zip(holes, suggestions, strict=True) if mid_word(h)]
            ),
        }
    scored["suggestions"] = suggestions
    return scored


def _rescore(found: dict[str, Any], name: str, holes: Sequence[Hole], n: int) -> dict[str, Any]:
    suggestions = found[name]["suggestions"][:n]
    return score(holes[:n], suggestions, [])


def corpus_context(
    corpus: Path, settings: config.Settings, cache_dir: Path
) -> tuple[Any, ContextSource]:
    """An index of the corpus (built or brought up to date) and a context source over it."""
    from indexer.service import index_workspace
    from lsp_server.retrieval import WorkspaceContext

    started = time.perf_counter()
    index, _ = index_workspace(corpus, settings.index, cache_dir)
    print(f"indexed {corpus} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    context = WorkspaceContext(lambda: index, lambda _uri: None, lambda: corpus)
    return index, context


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of `tabloop eval holes` (`argv` kept in the report's `command`)."""
    parser = argparse.ArgumentParser(prog="tabloop eval holes", description=__doc__)
    parser.add_argument("--corpus", required=True, help="directory of real source files")
    parser.add_argument("--n", type=int, default=200, help="holes to sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="completion model (default: configured)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--no-retrieval", action="store_true", help="skip the run with an index")
    parser.add_argument(
        "--engines",
        default="",
        help="local engines to compare on the same holes, the new one first "
        "(e.g. ctranslate2,torch); default: the configured one",
    )
    parser.add_argument(
        "--baseline-n", type=int, default=0, help="holes for the engines after the first (0: all)"
    )
    parser.add_argument(
        "--healing-baseline",
        action="store_true",
        help="also complete the mid-word holes without token healing (run without retrieval)",
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also complete the same holes with this setting changed (repeatable) and report "
        "both, with per-hole paired differences (this run's minus theirs) and standard errors",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a completion setting for this run (snake_case, JSON value), e.g. snippet_share=0.3",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str]) -> int:
    print(json.dumps(run_holes(parse_args(argv)), indent=2))
    return 0
