"""`tabloop demo`: the real server, over stdio, from a real LSP client, on real code.

It copies a few modules of this machine's Python standard library into a scratch workspace,
starts `python -m lsp_server` as an editor would, waits for the model, and asks for completions
where a person would be typing: part-way into a line inside a function body, with the rest of
that line not yet written. For each it prints the line typed so far, the suggestion, what the
file really says, and the latency.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsp_server.client import TabloopClient, item_text

DEMO_MODULES = ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py")
READY_TIMEOUT_S = 900.0


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


def find_holes(path: Path, count: int, rng: random.Random) -> list[Hole]:
    """Positions inside function bodies, after the first token of a statement line."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    candidates: list[int] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in node.body[1:] if ast.get_docstring(node) else node.body:
                if isinstance(statement, ast.Assign | ast.Return | ast.Expr | ast.If):
                    candidates.append(statement.lineno - 1)
    rng.shuffle(candidates)
    holes = []
    for line in candidates:
        content = lines[line]
        stripped = content.lstrip()
        if len(stripped) < 12 or stripped.startswith(("#", '"', "'")):
            continue
        indent = len(content) - len(stripped)
        # Type a few characters of the statement, as a person part-way through the line.
        column = indent + min(len(stripped) // 3, 12)
        holes.append(Hole(path, line, column, content[:column], content[column:]))
        if len(holes) == count:
            break
    return holes


def document_with_hole(path: Path, hole: Hole) -> str:
    """The file as it is while the line is being typed: the rest of that line not yet there."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    ending = "\n" if lines[hole.line].endswith("\n") else ""
    lines[hole.line] = hole.typed + ending
    return "".join(lines)


async def complete_holes(client: TabloopClient, holes: list[Hole]) -> list[tuple[Hole, str, float]]:
    """Open each file as it is mid-typing, ask for a suggestion, accept the first per file."""
    results = []
    accepted_in: set[Path] = set()
    for hole in holes:
        uri = client.open(hole.path, document_with_hole(hole.path, hole))
        started = time.perf_counter()
        items = await client.inline(uri, hole.line, hole.column)
        latency_ms = (time.perf_counter() - started) * 1000
        suggestion = item_text(items[0]) if items else ""
        if items and hole.path not in accepted_in:
            await client.accept(items[0])
            accepted_in.add(hole.path)
        client.close(uri)
        results.append((hole, suggestion, latency_ms))
    return results


def print_result(hole: Hole, suggestion: str, latency_ms: float) -> None:
    print(f"\n{hole.path.name}:{hole.line + 1}:{hole.column + 1}  ({latency_ms:.0f} ms)")
    print(f"  typed      | {hole.typed}")
    shown = suggestion.splitlines() or ["(silence)"]
    print(f"  suggestion | {hole.typed}{shown[0]}")
    for extra in shown[1:4]:
        print(f"             | {extra}")
    print(f"  file says  | {hole.typed}{hole.truth}")


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="tabloop-demo-") as scratch:
        workspace = Path(scratch) / "workspace"
        files = make_workspace(workspace)[: args.files]
        print(f"workspace: {len(files)} standard-library modules copied to {workspace}")
        holes = [hole for path in files for hole in find_holes(path, args.positions, rng)]

        init_options: dict[str, Any] = {}
        if args.model:
            init_options["completion"] = {"model": args.model}
        client = TabloopClient(echo=True)
        started = time.perf_counter()
        initialize_ms = await client.launch(workspace, init_options)
        print(f"initialize answered in {initialize_ms:.0f} ms")
        print("loading the completion model in the server (the first run assembles it)...")
        status = await client.wait_until_ready(READY_TIMEOUT_S)
        model = status["model"]
        print(
            f"model {model['state']} after {time.perf_counter() - started:.1f} s: "
            f"{model['modelId']}"
        )
        if model["state"] != "ready":
            print(
                f"the model is not ready: {model.get('error') or model['state']}", file=sys.stderr
            )
            await client.close_server()
            return 1
        results = await complete_holes(client, holes)
        for hole, suggestion, latency_ms in results:
            print_result(hole, suggestion, latency_ms)
        status = await client.status()
        decisions = status["decisions"]
        print(
            f"\nsummary: {decisions['requests']} requests, {decisions['shown']} shown, "
            f"{decisions['silenced']} silenced, {decisions['accepted']} accepted "
            f"(policy {status['policy']['version']})"
        )
        await client.close_server()
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of `tabloop demo`."""
    return asyncio.run(run(args))
