"""`tabloop demo`: the whole loop, on real code, with the real server and a real LSP client.

1. A few modules of this machine's Python standard library are copied into a scratch workspace.
2. A training backend starts on loopback, with a fresh database and tenant.
3. The workspace is indexed (progress bar) and searched by meaning.
4. `python -m lsp_server` starts as an editor would start it, and is asked for completions where
   a person would be typing: part-way into a line inside a function body, with the rest of that
   line not yet written. The person takes a suggestion that says what the file really says next
   and types on otherwise; the server infers the outcomes and reports every decision to the
   backend.
5. The backend's summary shows what reached it, and one round of the learning loop trains a
   candidate policy on those events and says whether it would be promoted, and why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluation.lsp_client import TabloopClient, item_text
from evaluation.positions import Draw, FunctionStatements, read_sources, sample_cursors
from lsp_server import config
from lsp_server.config import Settings

if TYPE_CHECKING:
    from backend.local import LocalBackend

DEMO_MODULES = ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py")
READY_TIMEOUT_S = 900.0
SEARCHES = ("split a string into words like a shell", "wrap long text into lines of a width")


@dataclass(frozen=True)
class Hole:
    """A cursor part-way into a real line: what is typed, and what the file says next."""

    path: Path
    line: int
    column: int
    typed: str
    truth: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def make_workspace(target: Path, modules: tuple[str, ...] = DEMO_MODULES) -> list[Path]:
    """Copy real standard-library modules into `target`; returns the copies."""
    target.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in modules:
        source = stdlib_dir() / name
        if source.is_file():
            copies.append(Path(shutil.copy(source, target / name)))
    return copies


def find_holes(paths: list[Path], count: int, rng: random.Random) -> list[Hole]:
    """`count` positions in each file, inside function bodies, part-way into a statement line."""
    cursors = sample_cursors(read_sources(paths), count, rng, FunctionStatements(), Draw.PER_FILE)
    return [
        Hole(
            c.source.path, c.line.number, c.column, c.line.text[: c.column], c.line.text[c.column :]
        )
        for c in cursors
    ]


def document_with_hole(path: Path, hole: Hole) -> str:
    """The file as it is while the line is being typed: the rest of that line not yet there."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    ending = "\n" if lines[hole.line].endswith("\n") else ""
    lines[hole.line] = hole.typed + ending
    return "".join(lines)


async def complete_holes(
    client: TabloopClient, holes: list[Hole]
) -> list[tuple[Hole, str, float, str]]:
    """Open each file mid-typing, ask for a suggestion, and act as its author would.

    The author takes a suggestion whose first line is exactly the rest of the line they were
    about to type (accepting it, as an editor does: the text is inserted and the accept command
    runs) and otherwise types on, which the server infers as an ignored suggestion.
    """
    results = []
    for hole in holes:
        uri = client.open(hole.path, document_with_hole(hole.path, hole))
        started = time.perf_counter()
        items = await client.inline(uri, hole.line, hole.column)
        latency_ms = (time.perf_counter() - started) * 1000
        suggestion = item_text(items[0]) if items else ""
        if not items:
            action = "silence"
        elif suggestion.split("\n", 1)[0].rstrip() == hole.truth.rstrip():
            client.insert(uri, hole.line, hole.column, suggestion)
            await client.accept(items[0])
            action = "accepted"
        else:
            client.insert(uri, hole.line, hole.column, hole.truth[:1] or " ")
            action = "typed on"
        client.close(uri)
        results.append((hole, suggestion, latency_ms, action))
    return results


def print_result(hole: Hole, suggestion: str, latency_ms: float, action: str) -> None:
    print(f"\n{hole.path.name}:{hole.line + 1}:{hole.column + 1}  ({latency_ms:.0f} ms, {action})")
    print(f"  typed      | {hole.typed}")
    if not suggestion:
        print("  suggestion | (silence: the policy chose not to show one)")
    else:
        shown = suggestion.splitlines()
        print(f"  suggestion | {hole.typed}{shown[0]}")
        for extra in shown[1:4]:
            print(f"             | {extra}")
    print(f"  file says  | {hole.typed}{hole.truth}")


def index_and_search(workspace: Path, settings: Settings, queries: tuple[str, ...]) -> None:
    """Index the workspace in the foreground, one progress line per stage, then search it."""
    from indexer.progress import LOAD, StageProgress
    from indexer.service import index_workspace

    # On stderr, so that the demo's story on stdout reads the same piped to a file.
    progress = StageProgress(sys.stderr)
    progress.begin(LOAD)
    try:
        index, stats = index_workspace(workspace, settings.index, settings.cache_path(), progress)
    finally:
        progress.close()
    try:
        if stats is not None:
            print(
                f"indexed {stats.files_scanned} files: {stats.chunks_total} chunks, "
                f"{stats.chunks_embedded} embedded, {stats.chunks_reused} reused from the cache"
            )
        for query in queries:
            print(f"\nsearch: {query!r}")
            for hit in index.search(query, k=3):
                first = hit.preview.strip().splitlines()[0] if hit.preview.strip() else ""
                print(f"  {hit.score:.2f}  {hit.path}:{hit.start_line + 1}  {first[:70]}")
    finally:
        index.close()


def training_round(backend: LocalBackend) -> None:
    """One round of the learning loop on the events the demo produced."""
    from backend.policy.loop import run_training
    from backend.policy.settings import TrainerSettings

    # The production minimum is 200 decisions; the demo has a few, so it says what it can.
    settings = TrainerSettings(min_events=10)
    summary = run_training(backend.storage, backend.principal.tenant_id, settings)
    report = summary.report
    print(f"\nlearning loop: {summary.events} rewarded decisions, serving {summary.serving_before}")
    if summary.candidate is None:
        print(f"  no candidate trained: {report.get('skipped', 'not enough events')}")
        return
    verdict = "promoted" if summary.promoted else "not promoted"
    print(f"  candidate {summary.candidate}: {verdict}")
    for key in ("verdict", "reason", "candidate", "serving"):
        if key in report:
            print(f"  {key}: {json.dumps(report[key], default=str)[:200]}")


async def run(args: argparse.Namespace) -> int:
    from backend.local import LocalBackend

    rng = random.Random(7)
    settings = config.resolve(None).settings
    with tempfile.TemporaryDirectory(prefix="tabloop-demo-") as scratch:
        workspace = Path(scratch) / "workspace"
        files = make_workspace(workspace)[: args.files]
        print(f"workspace: {len(files)} standard-library modules copied to {workspace}")
        holes = find_holes(files, args.positions, rng)

        backend = LocalBackend().start()
        print(f"training backend on {backend.url} (tenant {backend.tenant!r})\n")
        try:
            index_and_search(workspace, settings, SEARCHES)
            code = await complete_with_server(args, workspace, holes, backend)
            summary = backend.summary()
            print(
                f"\nbackend received {summary['events']} events: decisions "
                f"{summary['decisions']}, outcomes {summary['outcomes']}"
            )
            training_round(backend)
        finally:
            backend.stop()
    return code


async def complete_with_server(
    args: argparse.Namespace, workspace: Path, holes: list[Hole], backend: LocalBackend
) -> int:
    init_options: dict[str, Any] = {
        "backend": {"url": backend.url, "token": backend.token},
        "telemetry": {"flushIntervalS": 0.5},
    }
    if args.model:
        init_options["completion"] = {"model": args.model}
    client = TabloopClient(echo=True)
    started = time.perf_counter()
    initialize_ms = await client.launch(workspace, init_options)
    print(f"\nserver started and initialized in {initialize_ms:.0f} ms")
    print("loading the completion model in the server (the first run assembles it)...")
    status = await client.wait_until_ready(READY_TIMEOUT_S)
    model = status["model"]
    print(f"model {model['state']} after {time.perf_counter() - started:.1f} s: {model['modelId']}")
    if model["state"] != "ready":
        print(f"the model is not ready: {model.get('error') or model['state']}", file=sys.stderr)
        await client.close_server()
        return 1
    results = await complete_holes(client, holes)
    for result in results:
        print_result(*result)
    status = await client.status()
    decisions = status["decisions"]
    print(
        f"\nserver: {decisions['requests']} requests, {decisions['shown']} shown, "
        f"{decisions['silenced']} silenced, {decisions['accepted']} accepted "
        f"(policy {status['policy']['version']})"
    )
    await client.close_server()  # shutting down flushes the telemetry spool
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of `tabloop demo`."""
    return asyncio.run(run(args))
