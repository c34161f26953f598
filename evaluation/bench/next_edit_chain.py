"""The next edit after an accepted one: computed ahead (`nextEdit.prefetch`) against not; or the
first edit, with the start of its prompt read between edits (`nextEdit.preread`) against not.

Two real servers run over stdio, each with its default settings but one: `nextEdit.prefetch`
(or with `--vary preread`, `nextEdit.preread`) on (the default) and off (the baseline). Both are
driven through the same edits of a real repository's history, point by point, the order of the
two alternating from point to point, so that a change in the machine's load falls on both alike;
only one works at a time: after each point the client waits until that server's model thread is
idle (`tabloop/status`'s `model.jobs`; work the server goes on with by itself, such as computing
the inline suggestion after a shown one, would otherwise run beside the other server's point).

At each point (drawn as `tabloop eval edits` draws them: `training.edit_replay`, the last
`--history` hunks the point's history holds) the client makes the hunks in their documents, each
as one whole-text `didChange` a pause apart (`--pause-s`, past the history's 1 s, so each is an
event of its own as in the replay), and asks for the next edit at the cursor after the client's
debounce (`--debounce-ms`, the editors' 300 ms). When edits are shown, the user reads them for
`--read-ms`, then accepts as the editors do on Tab: the edits applied as one change (the last
first), the cursor after the last one, `tabloop.acceptNextEdit`; and asks again there at once,
as both editors' clients do after Tab (`--after-tab-ms`: a wait before it; the clients, and the
bench, used to wait the debounce there: results without `after_tab_ms` in their settings did,
and `--after-tab-ms 300` measures the same). That second answer is what prefetch is for: its
round trip, and its time from the acceptance (the wait and the round trip), are reported for both
servers, with how many were answered without a model call (`reused`) and whether both servers
answered alike. A shown second answer is then dismissed, as a user going on to the next point
would.

With `--inline-after-tab-ms MS` the client also asks for an inline completion at the cursor MS
after the acceptance, as Neovim's own inline completion does 200 ms after the cursor moves (VS
Code asks for none after a command's edit). That request takes the model thread too; its round
trip and whether it showed a suggestion are reported beside the chain.

The first request at each point is what `nextEdit.preread` is for: the edits before it are made
a pause apart, past the history's, so each is an event of its own, and between them the server
reads the start of the next prompt. Its round trip is reported for every first request, for
those that reached the model, and for those answered with edits (the debounce before it is
`settings.debounce_ms`), with the prompt tokens the model computed and those it kept from before
(`first_prompt_tokens`). Results printed before that setting was there ran both servers without
it; `--options '{"nextEdit": {"preread": false}}'` repeats them. Since a server reads once the
history's pause has passed after the last change, the client also waits that long after a
point's last change before it takes the model thread to be idle.

Both servers see the same edits in the same order, so the prompts are the same; they may still
show different edits at a point (bfloat16 products round by the size of a pass, and a prefetched
rewrite can be read in other passes than a requested one), and a chain is timed only where a
server showed one: `chains.both` counts the points where both did.

    tabloop bench next-edit-chain --repo DIR [--commits A..B | --last 100] [--points 100]
        [--seed 0] [--read-ms 1000] [--after-tab-ms 0] [--inline-after-tab-ms MS]
        [--vary prefetch|preread] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types

from common.config import deep_merge
from common.machine import cpu_description
from completion.next_edit.history import PAUSE_S
from completion.next_edit.text import breaks, lines_of
from evaluation.bench.lsp import percentile
from evaluation.lsp_client import TabloopClient, plain
from lsp_server.documents import column_index
from lsp_server.features.next_edit import client_column
from lsp_server.protocol import (
    ACCEPT_NEXT_EDIT_COMMAND,
    DID_SHOW_INLINE_EDIT_NOTIFICATION,
    NEXT_EDIT_REJECTED_NOTIFICATION,
    NEXT_EDIT_REQUEST,
    NEXT_EDIT_TIMINGS_REQUEST,
)
from training.edit_replay import (
    EditPoint,
    GitHistory,
    ReplayError,
    ReplaySettings,
    lines_window,
    replay_commits,
    sample_points,
)

VARIED = ("prefetch", "preread")  # the `nextEdit` settings a run can compare on and off
BASELINE = "baseline"
QUIET_S = PAUSE_S + 0.2  # after a change, past the history's pause and the read it may start
UTF16 = types.PositionEncodingKind.Utf16  # what the servers negotiate with this client


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` in ms, rounded (None when there are none)."""
    return round(percentile(values, q), 1) if values else None


def offset_at(text: str, line: int, character: int) -> int:
    """The offset in `text` of an LSP position (UTF-16 columns)."""
    lines = lines_of(text)
    if line >= len(lines):
        return len(text)
    return sum(map(len, lines[:line])) + column_index(lines[line], character, UTF16)


def position_at(text: str, offset: int) -> tuple[int, int]:
    """The LSP position (UTF-16 columns) of `offset` in `text`."""
    head = text[:offset]
    start = max(head.rfind("\n"), head.rfind("\r")) + 1
    return breaks(head), client_column(head[start:], offset - start, UTF16)


@dataclass
class Server:
    """One server, the documents it has open, and what was measured on it."""

    name: str
    client: TabloopClient
    root: Path
    texts: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    first_ms: list[float] = field(default_factory=list)
    first_reasons: dict[str, int] = field(default_factory=dict)
    first_timings: list[dict[str, Any]] = field(default_factory=list)
    shown: int = 0
    chained: list[dict[str, Any]] = field(default_factory=list)
    idle_wait_ms: list[float] = field(default_factory=list)
    not_idle: int = 0
    changed_at: float = 0.0  # `time.monotonic()` of the last change sent

    def uri(self, path: str) -> str:
        return (self.root / path).as_uri()

    def put(self, path: str, before: str, after: str) -> None:
        """Make one edit in `path`: the document as `before` (opened again if it is not), then
        `after`, as one whole-text change."""
        uri = self.uri(path)
        if self.texts.get(uri) != before:
            if uri in self.texts:
                self.client.close(uri)
            self.client.open(self.root / path, before)
            self.versions[uri] = 1
        self.change(uri, [types.TextDocumentContentChangeWholeDocument(text=after)], after)

    def change(
        self, uri: str, changes: list[types.TextDocumentContentChangeEvent], text: str
    ) -> None:
        self.versions[uri] += 1
        self.texts[uri] = text
        self.changed_at = time.monotonic()
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=uri, version=self.versions[uri]
                ),
                content_changes=changes,
            )
        )

    async def ask(self, uri: str, cursor: tuple[int, int]) -> tuple[list[dict[str, Any]], float]:
        started = time.perf_counter()
        answer = plain(
            await self.client.protocol.send_request_async(
                NEXT_EDIT_REQUEST,
                {
                    "textDocument": {"uri": uri, "version": self.versions[uri]},
                    "position": {"line": cursor[0], "character": cursor[1]},
                    "context": {"triggerKind": 2},
                },
            )
        )
        return list(answer["edits"]), (time.perf_counter() - started) * 1000

    async def last_timing(self) -> dict[str, Any]:
        timings = plain(
            await self.client.protocol.send_request_async(NEXT_EDIT_TIMINGS_REQUEST, {})
        )
        found: dict[str, Any] = timings[-1]
        return found

    async def accept(self, uri: str, items: list[dict[str, Any]]) -> tuple[int, int]:
        """What the editors do on Tab: every edit in one change (the last first), the cursor
        after the last one (`offsetAfterApply`), the accept command. Returns the cursor."""
        text = self.texts[uri]
        spans = [
            (offset_at(text, **i["range"]["start"]), offset_at(text, **i["range"]["end"]), i)
            for i in items
        ]
        changes: list[types.TextDocumentContentChangeEvent] = []
        after = text
        for start, end, item in reversed(spans):
            after = after[:start] + item["text"] + after[end:]
            changes.append(
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(**item["range"]["start"]),
                        end=types.Position(**item["range"]["end"]),
                    ),
                    text=item["text"],
                )
            )
        shift = sum(len(i["text"]) - (end - start) for start, end, i in spans[:-1])
        cursor = spans[-1][0] + shift + len(spans[-1][2]["text"])
        self.change(uri, changes, after)
        await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(
                command=ACCEPT_NEXT_EDIT_COMMAND, arguments=items[0]["command"]["arguments"]
            )
        )
        return position_at(after, cursor)

    async def ask_inline(
        self, uri: str, cursor: tuple[int, int], after_ms: float
    ) -> tuple[float, bool]:
        """An automatic inline completion request at `cursor` `after_ms` from now: its round
        trip and whether it showed a suggestion (none is accepted)."""
        await asyncio.sleep(after_ms / 1000)
        started = time.perf_counter()
        items = await self.client.inline(uri, *cursor, invoked=False)
        return (time.perf_counter() - started) * 1000, bool(items)

    async def wait_until_idle(self, timeout_s: float = 120.0) -> None:
        """Until the history's pause has passed since the last change (the server may start
        work then: `nextEdit.preread`) and the model thread has no job queued or running (at
        most `timeout_s`, then counted in `not_idle`); the wait is kept."""
        started = time.perf_counter()
        await asyncio.sleep(max(0.0, self.changed_at + QUIET_S - time.monotonic()))
        deadline = time.monotonic() + timeout_s
        while (await self.client.status())["model"]["jobs"]:
            if time.monotonic() > deadline:
                self.not_idle += 1
                break
            await asyncio.sleep(0.05)
        self.idle_wait_ms.append((time.perf_counter() - started) * 1000)

    def dismiss(self, items: list[dict[str, Any]]) -> None:
        self.client.protocol.notify(
            NEXT_EDIT_REJECTED_NOTIFICATION, {"id": items[0]["id"], "reason": "dismissed"}
        )


async def run_point(server: Server, point: EditPoint, args: argparse.Namespace) -> dict[str, Any]:
    """The point's edits, the request there, and when edits are shown, the chain after them."""
    edits = point.history[-args.history :]
    for number, edit in enumerate(edits):
        if number:
            await asyncio.sleep(args.pause_s)
        server.put(edit.path, edit.before, edit.after)
    await asyncio.sleep(args.debounce_ms / 1000)
    uri = server.uri(point.path)
    lines = lines_of(point.text)
    line = lines[point.cursor[0]] if point.cursor[0] < len(lines) else ""
    cursor = (point.cursor[0], len(line[: point.cursor[1]].encode("utf-16-le")) // 2)
    items, first_ms = await server.ask(uri, cursor)
    server.first_ms.append(first_ms)
    first_timing = await server.last_timing()
    reason = first_timing["reason"] or "none"
    server.first_reasons[reason] = server.first_reasons.get(reason, 0) + 1
    server.first_timings.append({**first_timing, "round_trip_ms": first_ms, "shown": bool(items)})
    if not items:
        return {"shown": False}
    server.shown += 1
    server.client.protocol.notify(DID_SHOW_INLINE_EDIT_NOTIFICATION, {"item": items[0]})
    await asyncio.sleep(args.read_ms / 1000)
    accepted_at = time.perf_counter()
    cursor = await server.accept(uri, items)
    inline = None
    if args.inline_after_tab_ms is not None:
        inline = asyncio.create_task(server.ask_inline(uri, cursor, args.inline_after_tab_ms))
    await asyncio.sleep(args.after_tab_ms / 1000)
    second, request_ms = await server.ask(uri, cursor)
    from_accept_ms = (time.perf_counter() - accepted_at) * 1000
    timing = await server.last_timing()
    inline_found = await inline if inline is not None else None
    if second:
        server.dismiss(second)
    chained = {
        "shown": True,
        "request_ms": request_ms,
        "from_accept_ms": from_accept_ms,
        "reused": bool(timing.get("reused")),
        "reached_model": bool(timing.get("reached_model")),
        "outcome": timing.get("outcome"),
        "reason": timing.get("reason"),
        "answer": [(i["range"], i["text"]) for i in second],
        "first": [(i["range"], i["text"]) for i in items],
    }
    if inline_found is not None:
        chained["inline_ms"], chained["inline_shown"] = inline_found
    server.chained.append(chained)
    return chained


def first_requests(server: Server) -> dict[str, Any]:
    """The first requests' round trips where they reached the model (a model call, not a
    kept rewrite) and where edits were shown, and their prompts' tokens."""
    called = [t for t in server.first_timings if t["reached_model"] and not t["reused"]]
    shown = [t["round_trip_ms"] for t in server.first_timings if t["shown"]]
    ms = [t["round_trip_ms"] for t in called]
    prompt = [float(t["prompt_tokens"]) for t in called]
    cached = [float(t.get("cached_tokens", 0)) for t in called]
    return {
        "first_model_calls": len(called),
        "first_model_request_ms": {"p50": quantile(ms, 0.5), "p95": quantile(ms, 0.95)},
        "first_shown_request_ms": {"p50": quantile(shown, 0.5), "p95": quantile(shown, 0.95)},
        "first_prompt_tokens": {
            "p50": quantile(prompt, 0.5),
            "cached_p50": quantile(cached, 0.5),
            "cached_share": round(sum(cached) / sum(prompt), 3) if sum(prompt) else None,
        },
    }


def summary(server: Server) -> dict[str, Any]:
    chained = server.chained
    request = [c["request_ms"] for c in chained]
    from_accept = [c["from_accept_ms"] for c in chained]
    inline = [c["inline_ms"] for c in chained if "inline_ms" in c]
    return {
        "points": len(server.first_ms),
        "first_request_ms": {
            "p50": quantile(server.first_ms, 0.5),
            "p95": quantile(server.first_ms, 0.95),
        },
        "first_reasons": dict(sorted(server.first_reasons.items())),
        **first_requests(server),
        "edits_shown": server.shown,
        "chains": len(chained),
        "chained_request_ms": {"p50": quantile(request, 0.5), "p95": quantile(request, 0.95)},
        "chained_from_accept_ms": {
            "p50": quantile(from_accept, 0.5),
            "p95": quantile(from_accept, 0.95),
            "mean": round(statistics.fmean(from_accept), 1) if from_accept else None,
        },
        "chained_reused": sum(c["reused"] for c in chained),
        "chained_model_calls": sum(c["reached_model"] and not c["reused"] for c in chained),
        "idle_wait_ms": {
            "p50": quantile(server.idle_wait_ms, 0.5),
            "p95": quantile(server.idle_wait_ms, 0.95),
            "max": round(max(server.idle_wait_ms), 1) if server.idle_wait_ms else None,
            "not_idle": server.not_idle,
        },
        "chained_outcomes": {
            outcome: sum(c["outcome"] == outcome for c in chained)
            for outcome in sorted({c["outcome"] for c in chained})
        },
        **(
            {
                "inline_after_tab_ms": {
                    "p50": quantile(inline, 0.5),
                    "p95": quantile(inline, 0.95),
                },
                "inline_after_tab_shown": sum(bool(c.get("inline_shown")) for c in chained),
            }
            if inline
            else {}
        ),
    }


async def launch(
    name: str, root: Path, cache: Path | None, varied: dict[str, bool], extra: dict[str, Any]
) -> Server:
    client = TabloopClient()
    options = deep_merge({"index": {"enabled": False}, "telemetry": {"level": "off"}}, extra)
    options = deep_merge(options, {"nextEdit": varied})
    if cache is not None:
        options["cacheDir"] = str(cache)
    await client.launch(root, options)
    status = await client.wait_until_ready(900)
    if status["model"]["state"] != "ready":
        raise SystemExit(f"tabloop bench next-edit-chain: the model did not load: {status}")
    deadline = time.monotonic() + 600
    while True:  # next edits' own runner loads after the engine
        part = (await client.status())["nextEdit"]
        if part["engine"] != "torch-bfloat16" or part["runnerModelId"] or part["runnerError"]:
            break
        if time.monotonic() > deadline:
            raise SystemExit("tabloop bench next-edit-chain: the next-edit runner did not load")
        await asyncio.sleep(0.5)
    return Server(name, client, root)


async def run(args: argparse.Namespace, points: list[EditPoint]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tabloop-chain-") as scratch:
        base = Path(scratch)
        servers: dict[str, Server] = {}
        names = (args.vary, BASELINE)
        for name in names:
            (base / name).mkdir()
            cache = Path(args.cache_dir) if args.cache_dir else None
            varied = {args.vary: name != BASELINE}
            servers[name] = await launch(name, base / name, cache, varied, args.server_options)
        statuses: dict[str, Any] = {}
        both = identical = 0
        try:
            for number, point in enumerate(points):
                order = names if number % 2 == 0 else names[::-1]
                found = {}
                for name in order:
                    found[name] = await run_point(servers[name], point, args)
                    await servers[name].wait_until_idle()
                if all(f["shown"] for f in found.values()):
                    both += 1
                    first, second = (found[name] for name in names)
                    identical += first["first"] == second["first"] and (
                        first["answer"] == second["answer"]
                    )
                if args.progress:
                    print(f"  point {number + 1}/{len(points)}", file=sys.stderr)
            for name, server in servers.items():
                status = await server.client.status()
                statuses[name] = {
                    "configuration": {
                        "model": status["model"]["modelId"],
                        "nextEdit": {
                            k: status["nextEdit"][k] for k in ("engine", "runnerModelId", "adapter")
                        },
                    },
                    "prefetch": {
                        k: status["nextEdit"][k]
                        for k in ("prefetchStarted", "prefetchUsed", "prefetchCancelled")
                    },
                    "preread": status["nextEdit"]["preread"],
                }
        finally:
            for server in servers.values():
                await server.client.close_server()
    report: dict[str, Any] = {
        name: {**summary(server), **statuses.get(name, {})} for name, server in servers.items()
    }
    report["chains_both"] = {"points": both, "identical_answers": identical}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tabloop bench next-edit-chain", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repo", required=True, help="a git repository with history")
    parser.add_argument("--commits", default="", help="a range A..B (default: --last)")
    parser.add_argument("--last", type=int, default=100, help="the newest commits replayed")
    parser.add_argument("--points", type=int, default=100, help="points drawn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=int, default=3, help="hunks made before each request")
    parser.add_argument("--pause-s", type=float, default=1.1, help="between the hunks")
    parser.add_argument("--debounce-ms", type=float, default=300.0, help="the clients' debounce")
    parser.add_argument("--read-ms", type=float, default=1000.0, help="reading before Tab")
    parser.add_argument(
        "--after-tab-ms",
        type=float,
        default=0.0,
        help="wait after Tab before asking again (the clients: none; they waited 300 before)",
    )
    parser.add_argument(
        "--inline-after-tab-ms",
        type=float,
        default=None,
        help="also ask for an inline completion this long after Tab (Neovim: 200)",
    )
    parser.add_argument(
        "--vary",
        choices=VARIED,
        default="prefetch",
        help="the nextEdit setting on in one server and off in the other",
    )
    parser.add_argument("--cache-dir", default="", help="the servers' cache (default: the usual)")
    parser.add_argument(
        "--options",
        default="{}",
        help="settings (JSON, as `initializationOptions`) both servers get beyond the defaults",
    )
    parser.add_argument("--progress", action="store_true", help="a line per point on stderr")
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    args = parser.parse_args(argv)
    try:
        args.server_options = json.loads(args.options)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"tabloop bench next-edit-chain: --options is not JSON: {exc}") from None
    if not isinstance(args.server_options, dict):
        raise SystemExit("tabloop bench next-edit-chain: --options must be a JSON object")
    repo = Path(args.repo).resolve()
    try:
        history = GitHistory(repo)
        commits = history.commits(args.commits, args.last if not args.commits else 0)
    except ReplayError as exc:
        raise SystemExit(f"tabloop bench next-edit-chain: {exc}") from None
    settings = ReplaySettings()
    found, _counts = replay_commits(history, commits, settings, lines_window(settings.window_lines))
    points = sample_points(found, args.points, args.seed)
    if not points:
        raise SystemExit(f"tabloop bench next-edit-chain: no points in {repo}")
    started = time.perf_counter()
    report = asyncio.run(run(args, points))
    out = {
        "command": "tabloop bench next-edit-chain " + " ".join(argv or sys.argv[1:]),
        "repo": str(repo),
        "head": history.git("rev-parse", "HEAD").strip(),
        "commits": history.describe_range(commits),
        "points": len(points),
        "settings": {
            "history": args.history,
            "pause_s": args.pause_s,
            "debounce_ms": args.debounce_ms,
            "read_ms": args.read_ms,
            "after_tab_ms": args.after_tab_ms,
            "inline_after_tab_ms": args.inline_after_tab_ms,
            "seed": args.seed,
            "servers": f"defaults, index off, telemetry off; nextEdit.{args.vary} on / off",
            "options": args.server_options,
        },
        "cpu": cpu_description(),
        "wall_s": round(time.perf_counter() - started, 1),
        **report,
    }
    print(json.dumps(out, indent=2))
    return 0
