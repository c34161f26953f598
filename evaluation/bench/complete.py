"""`tabloop bench complete`: what a person typing a real file sees, at the real defaults.

A simulated person types part of a real standard-library function, character by character, at
a human cadence, into the real server over stdio, in a workspace of real code that the server
indexes first. Like an editor, the client asks for a suggestion once typing pauses for 150 ms,
and the next key cancels a request still in flight: a pause ends when the person types on, so a
suggestion counts as seen only if it was on screen before the next key. At a thinking pause
(1 s or more) the person takes (Tab) a suggestion that says exactly what they were about to
type, and the editor asks again at once, for the rest of the pause.

The `defaults` configuration is the server exactly as `tabloop serve` starts with no
configuration (the gate on, the index on, telemetry at its default level), except what the
report lists under `changed_from_defaults`: telemetry is sent to a real backend on a loopback
port, started for the run (by default nothing leaves the machine). Other configurations change
what they say on top of that: `gate_open` (the gate never silences: `policy.showFloor` 1.0),
`no_cache` (every cache and the prefetch off), `ct2` (CTranslate2 int8), `torch` (the torch
runner), `no_wait` (`completion.latencyWaitMs` 0), `index_torch` (the index's embedding model in
sentence-transformers), `no_training` (the background training loop
off) and `training` (a background training run of the workspace's adapter going on while the
person types: the loop's settings changed only so that the run is due at once, and the typing
starts once it has made a step; the loop pauses it while completions are served, as always).

Every request is counted, by how it ended (the server's own timing record of each request,
joined by its JSON-RPC id): shown, silenced by the gate, empty, latency skip, cancelled by the
next key (or before the server began it: `cancelled_before_handled`), stale. Reported for each
configuration:
- `pauses`: for each pause length, how many pauses had a suggestion on screen before the next
  key, after how long (from the keystroke, the 150 ms debounce included), and why not when
  not; `thinking_pauses` the same for pauses of 1 s or more, with the share of those whose
  suggestion the gate would show (not silenced, not empty) that was on screen in time, and
  `thinking_pause_latency_skips` what the server predicted at each of them it answered as too
  late (the time to the first token against the rest of the pause it expected);
- `all_requests_ms`: keystroke to answer (or to the cancelling key) over every request, by
  outcome;
- `model_calls_ms_p50/p95`: the same over every request that reached the model (not a cache
  hit, not skipped first), cancelled ones counted at the time they were cancelled;
- `model_served_ms_p50/p95`: keystroke to screen over suggestions a model call produced (the
  figure this benchmark reported before), beside `typing_cache_served` and `prefetch_served`;
- `model_served_parts_p50`: where those suggestions' time went in the server;
- `server_rss_mb`, `server_peak_rss_mb`: the language server's memory at the end and at peak;
  `server_anonymous_mb` and `server_file_backed_mb` split the first (mapped files' pages, the
  model's weights among them, can be dropped and read again); both are read a second after the
  last answer, and `server_rss_at_rest_mb` again `REST_S` (3 s) later, once the server has
  handed back what its last requests freed;
- `telemetry`: what the server's telemetry client sent and spooled.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types

from backend.local import bind_loopback
from backend.storage import Storage
from common.machine import cpu_description
from evaluation.bench.engines import server_memory_mb
from evaluation.bench.lsp import percentile
from evaluation.holes import setting_overrides
from evaluation.lsp_client import TabloopClient, plain
from lsp_server.protocol import TIMINGS_REQUEST

PAUSE_S = 0.150
THINK_S = 1.0
# Pause lengths (seconds) the report groups pauses by: [low, high).
PAUSE_BUCKETS = ((0.15, 0.3), (0.3, 0.6), (0.6, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 1e9))


@dataclass(frozen=True)
class Keystroke:
    char: str
    gap_s: float  # time since the previous keystroke


def typing_target(path: Path, max_chars: int) -> tuple[str, str, str]:
    """(text before, text to type, text after): the body of a real function, cut short.

    The cut falls at the end of a line, so the text after starts with a line break: the person
    types new lines into the function, and nothing follows the cursor on its line (as when
    writing code, not when retyping the middle of a line)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    functions = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.end_lineno and len(node.body) >= 3
    ]
    function = max(functions, key=lambda f: (f.end_lineno or 0) - f.lineno)
    first = function.body[1 if ast.get_docstring(function) else 0]
    start = sum(len(line) for line in lines[: first.lineno - 1])
    end = sum(len(line) for line in lines[: function.end_lineno])
    typed = source[start:end][:max_chars]
    if "\n" in typed.rstrip("\n"):
        typed = typed[: typed.rstrip("\n").rfind("\n")]
    return source[:start], typed, source[start + len(typed) :]


def cadence(text: str, rng: random.Random) -> list[Keystroke]:
    """Inter-key gaps of a fluent typist: quick within words, pauses at boundaries and lines.

    The gap of a key is the time before it, so a pause *after* a newline is the next key's."""
    keys = []
    previous = ""
    for char in text:
        if previous == "\n":
            gap = rng.uniform(1.5, 4.0)  # a thought at the end of a line
        elif previous in " (.,:=[":
            gap = rng.uniform(0.12, 0.4)
        else:
            gap = rng.uniform(0.05, 0.14)
        keys.append(Keystroke(char, gap))
        previous = char
    return keys


def position_after(text: str) -> types.Position:
    lines = text.split("\n")
    return types.Position(line=len(lines) - 1, character=len(lines[-1].encode("utf-16-le")) // 2)


@dataclass
class Asked:
    """One request, as the client saw it (times from `time.perf_counter`)."""

    request_id: str
    edit_at: float  # the keystroke (or accept) the pause followed
    answered_at: float | None = None
    cancelled_at: float | None = None
    suggestion: str = ""

    def elapsed_ms(self) -> float | None:
        end = self.answered_at if self.answered_at is not None else self.cancelled_at
        return None if end is None else (end - self.edit_at) * 1000


@dataclass
class Pause:
    gap_s: float
    first: Asked | None = None  # the request sent at the debounce
    on_screen_ms: float | None = None  # the first suggestion on screen, from the keystroke
    on_screen: Asked | None = None
    accepted: int = 0  # characters taken with Tab
    accepts: int = 0
    asked: list[Asked] = field(default_factory=list)


async def start_backend(db_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`tabloop backend` on a free loopback port; its URL once it answers."""
    import httpx

    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    with log.open("ab") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "backend.cli", "--port", str(port), "--db", db_url],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the backend exited; see {log}")
            try:
                await http.get(url + "/metrics", timeout=2)
                return process, url
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
    process.kill()
    raise RuntimeError("the backend did not answer within 120 s")


async def replay(
    keys: list[Keystroke],
    before: str,
    after: str,
    path: Path,
    changed: dict[str, Any],
    *,
    training: bool = False,
) -> dict[str, Any]:
    """Type `keys` into `path` through a server started with `changed` (and nothing else);
    with `training`, once the server's background run has made its first step."""
    client = TabloopClient()
    await client.launch(path.parent, changed)
    status = await client.wait_until_ready(900)
    if status["model"]["state"] != "ready":
        raise RuntimeError(f"model not ready: {status['model']}")
    index_s = await _wait_for_index(client)
    training_s = await _wait_for_training(client) if training else None
    status = await client.status()
    uri = client.open(path, before + after)
    start_status = status
    text = "".join(key.char for key in keys)
    typed = before
    pauses: list[Pause] = []
    pending: tuple[asyncio.Task[Any], Asked] | None = None
    sequence = 0

    async def ask(position: types.Position, msg_id: str) -> Any:
        return await client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION,
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=position,
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Automatic
                ),
            ),
            msg_id=msg_id,
        )

    def cancel_pending() -> None:
        nonlocal pending
        if pending is not None and not pending[0].done():
            client.protocol.notify(
                types.CANCEL_REQUEST, types.CancelParams(id=pending[1].request_id)
            )
            pending[1].cancelled_at = time.perf_counter()
            # The answer (cancelled) still comes back; nobody awaits it.
            pending[0].add_done_callback(lambda task: task.cancelled() or task.exception())
        pending = None

    number = 0
    while number < len(keys):
        position = position_after(typed)
        client.insert(uri, position.line, position.character, keys[number].char)
        typed += keys[number].char
        number += 1
        edit_at = time.perf_counter()
        cancel_pending()  # the key the person just typed
        # The pause after this key is the next key's gap.
        gap = keys[number].gap_s if number < len(keys) else 0.0
        pause_end = edit_at + gap
        if number >= len(keys):
            break  # the last key: no pause after it to measure
        if gap < PAUSE_S:
            await asyncio.sleep(gap)
            continue
        pause = Pause(gap)
        pauses.append(pause)
        while True:
            await asyncio.sleep(max(0.0, min(edit_at + PAUSE_S, pause_end) - time.perf_counter()))
            if time.perf_counter() >= pause_end or number >= len(keys):
                break
            sequence += 1
            asked = Asked(f"r{sequence}", edit_at)
            pause.first = pause.first or asked
            pause.asked.append(asked)
            task = asyncio.get_running_loop().create_task(
                ask(position_after(typed), asked.request_id)
            )
            pending = (task, asked)
            done, _ = await asyncio.wait({task}, timeout=max(0.0, pause_end - time.perf_counter()))
            if not done:
                break  # the next key comes first, and cancels it
            pending = None
            asked.answered_at = time.perf_counter()
            answer = None if task.exception() else task.result()
            asked.suggestion = (
                answer.items[0].insert_text if answer is not None and answer.items else ""
            )
            if asked.suggestion and pause.on_screen is None:
                pause.on_screen = asked
                pause.on_screen_ms = (asked.answered_at - pause.first.edit_at) * 1000
            # At a thinking pause the person takes a suggestion that says exactly what they
            # were about to type (Tab); the editor asks again at once after it.
            if gap >= THINK_S and asked.suggestion and text[number:].startswith(asked.suggestion):
                position = position_after(typed)
                client.insert(uri, position.line, position.character, asked.suggestion)
                typed += asked.suggestion
                number += len(asked.suggestion)
                pause.accepted += len(asked.suggestion)
                pause.accepts += 1
                edit_at = time.perf_counter()
                continue
            await asyncio.sleep(max(0.0, pause_end - time.perf_counter()))
            break
    cancel_pending()
    await asyncio.sleep(1.0)  # the last answers and timing records settle
    status = await client.status()
    timings = plain(await client.protocol.send_request_async(TIMINGS_REQUEST, {}))
    memory = server_memory_mb(client)
    await asyncio.sleep(REST_S)  # and once the server has been idle a while
    at_rest = server_memory_mb(client)
    await client.close_server()
    records = {t["request_id"]: t for t in timings if t["request_id"]}
    shown_settings = _merged(changed, {"backend": {"token": "(the run's backend token)"}})
    return {
        "changed_from_defaults": shown_settings,
        "index": {
            "files": status.get("index", {}).get("files"),
            "chunks": status.get("index", {}).get("chunks"),
            "seconds_waited_after_the_model": index_s,
        },
        **summarize(keys, pauses, records, start_status, status),
        "server_rss_mb": memory["rss_mb"],
        "server_peak_rss_mb": memory["peak_rss_mb"],
        "server_anonymous_mb": memory["anonymous_mb"],
        "server_file_backed_mb": memory["file_backed_mb"],
        "server_rss_at_rest_mb": at_rest["rss_mb"],
        "telemetry": status.get("telemetry", {}),
        # The background loop at the end: its state, and the run's pauses and last step.
        "training": {"seconds_waited_for_a_step": training_s, **status.get("training", {})},
    }


async def _wait_for_training(client: TabloopClient, timeout_s: float = 900) -> float:
    """Seconds until the server's background training run reported its first step (or ended:
    a small workspace's run may end before the status is read; the report's `training` says
    whether one was still going on at the end)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        training = (await client.status()).get("training") or {}
        if training.get("state") == "off":
            raise RuntimeError(f"background training is off: {training.get('reason')}")
        if (training.get("run") or {}).get("step") or (training.get("lastRun") or {}).get(
            "endedAt"
        ):
            return round(time.monotonic() - started, 1)
        await asyncio.sleep(0.5)
    raise RuntimeError("the background training run made no step in time")


async def _wait_for_index(client: TabloopClient, timeout_s: float = 900) -> float | None:
    """Seconds until the workspace index is ready (None: the index is off or failed)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        index = (await client.status()).get("index")
        if not index or index.get("state") in ("failed", "closed"):
            return None
        if index.get("state") in ("ready", "readonly") and not index.get("queued"):
            return round(time.monotonic() - started, 1)
        await asyncio.sleep(0.5)
    raise RuntimeError("the workspace index was not ready in time")


def summarize(
    keys: list[Keystroke],
    pauses: list[Pause],
    records: dict[str, dict[str, Any]],
    start_status: dict[str, Any],
    status: dict[str, Any],
) -> dict[str, Any]:
    """The report of one configuration: every request by its outcome, every pause by length."""
    asked = [a for pause in pauses for a in pause.asked]
    unrecorded = [
        a.request_id for a in asked if a.request_id not in records and a.cancelled_at is None
    ]

    def outcome(a: Asked) -> str:
        record = records.get(a.request_id)
        if record:
            return str(record["outcome"])
        # A request cancelled before the server's handler began leaves no record: pygls cancels
        # its task before it runs (the server's event loop was busy when the next key came).
        return "cancelled_before_handled" if a.cancelled_at is not None else "unrecorded"

    def source(a: Asked) -> str:
        record = records.get(a.request_id, {})
        return record.get("cache_source") or "model"

    def model_call(a: Asked) -> bool:
        record = records.get(a.request_id)
        return bool(
            record
            and record["reached_model"]
            and not record["cache_source"]
            and record["outcome"] not in ("latency_skip", "not_ready", "no_document")
        )

    by_outcome: dict[str, list[float]] = {}
    for a in asked:
        elapsed = a.elapsed_ms()
        if elapsed is not None:
            by_outcome.setdefault(outcome(a), []).append(elapsed)
    shown = [a for a in asked if a.suggestion]
    model_served = [a for a in shown if source(a) == "model"]
    model_calls = [a for a in asked if model_call(a)]
    model_call_ms = [ms for a in model_calls if (ms := a.elapsed_ms()) is not None]
    parts = [records[a.request_id] for a in model_served if a.request_id in records]
    model = status["model"]
    calls = model["calls"] - start_status["model"]["calls"]
    thinking = [p for p in pauses if p.gap_s >= THINK_S]
    return {
        "keystrokes": len(keys),
        "requests": len(asked),
        "requests_by_outcome": dict(Counter(outcome(a) for a in asked).most_common()),
        "unrecorded_requests": unrecorded,
        "suggestions_shown": len(shown),
        "characters_accepted": sum(p.accepted for p in pauses),
        "suggestions_accepted": sum(p.accepts for p in pauses),
        "pauses": [
            _pause_row(
                f"{low:g}-{high:g}s" if high < 1e9 else f">={low:g}s",
                [p for p in pauses if low <= p.gap_s < high],
                outcome,
            )
            for low, high in PAUSE_BUCKETS
        ],
        "thinking_pauses": _pause_row(f">={THINK_S:g}s", thinking, outcome),
        # Why the server judged a thinking pause too short: what it predicted the suggestion
        # would take, against the rest of the pause it expected, after waiting how long.
        "thinking_pause_latency_skips": [
            {
                "pause_s": round(p.gap_s, 2),
                "waited_ms": round(float(record.get("wait_ms", 0.0)), 1),
                "predicted_ms": round(float(record.get("predicted_ms", 0.0)), 1),
                "likely_pause_ms": round(float(record.get("likely_pause_ms", 0.0)), 1),
            }
            for p in thinking
            if p.first is not None
            and (record := records.get(p.first.request_id)) is not None
            and record["outcome"] == "latency_skip"
        ],
        "all_requests_ms": {
            "p50": _quantile([ms for found in by_outcome.values() for ms in found], 0.5),
            "p95": _quantile([ms for found in by_outcome.values() for ms in found], 0.95),
            "by_outcome": {
                name: {"n": len(found), "p50": _quantile(found, 0.5), "p95": _quantile(found, 0.95)}
                for name, found in sorted(by_outcome.items())
            },
        },
        "model_calls": len(model_calls),
        "model_calls_cancelled": sum(outcome(a) == "cancelled" for a in model_calls),
        "model_calls_ms_p50": _quantile(model_call_ms, 0.5),
        "model_calls_ms_p95": _quantile(model_call_ms, 0.95),
        "model_served": len(model_served),
        "typing_cache_served": sum(source(a) == "typing" for a in shown),
        "prefetch_served": sum(source(a) == "prefetch" for a in shown),
        "model_served_ms_p50": _quantile([a.elapsed_ms() or 0.0 for a in model_served], 0.5),
        "model_served_ms_p95": _quantile([a.elapsed_ms() or 0.0 for a in model_served], 0.95),
        "model_served_parts_p50": {
            name: _quantile([float(part.get(name, 0.0)) for part in parts], 0.5) for name in _PARTS
        },
        "model_calls_per_100_keystrokes": round(100 * calls / len(keys), 1),
        "prefill_tokens_per_call": round(
            (model["prefillTokens"] - start_status["model"]["prefillTokens"]) / max(calls, 1), 1
        ),
        "prefetch_used": status.get("prefetchUsed", 0) - start_status.get("prefetchUsed", 0),
    }


def _pause_row(name: str, pauses: list[Pause], outcome: Any) -> dict[str, Any]:
    """How many of `pauses` had a suggestion on screen before the next key, and why not."""
    seen = [p for p in pauses if p.on_screen is not None]
    why_not = Counter(
        (outcome(p.first) if outcome(p.first) != "shown" else "arrived_after_next_key")
        if p.first is not None
        else "not_asked"
        for p in pauses
        if p.on_screen is None
    )
    # Pauses whose suggestion the gate would show: not silenced, not empty (what the model
    # would say is unknown where the request was skipped or cancelled; those count against).
    wanted = len(pauses) - why_not["silenced"] - why_not["empty"]
    return {
        "pause": name,
        "n": len(pauses),
        "on_screen": len(seen),
        "on_screen_share": round(len(seen) / len(pauses), 3) if pauses else None,
        "gate_would_show": wanted,
        "on_screen_share_of_gate_would_show": round(len(seen) / wanted, 3) if wanted else None,
        "on_screen_ms_p50": _quantile([p.on_screen_ms or 0.0 for p in seen], 0.5),
        "on_screen_ms_p95": _quantile([p.on_screen_ms or 0.0 for p in seen], 0.95),
        "why_not": dict(why_not.most_common()),
    }


_PARTS = (
    "handler_ms",
    "wait_ms",
    "context_ms",
    "model_ms",
    "prefill_ms",
    "decode_ms",
    "prefill_tokens",
    "new_tokens",
)


def _quantile(values: list[float], q: float, digits: int = 1) -> float | None:
    """The q-quantile of `values`, rounded; None (JSON null) when there are none."""
    return round(percentile(values, q), digits) if values else None


REST_S = 3.0  # seconds idle before the memory is read again, at rest

CONFIGS: dict[str, dict[str, Any]] = {
    # `tabloop serve` with no configuration (telemetry sent to the run's loopback backend).
    "defaults": {},
    # The gate forced open: every suggestion the model writes is shown.
    "gate_open": {"policy": {"showFloor": 1.0}},
    # Every cache and the prefetch off.
    "no_cache": {"completion": {"cache": False, "prefetch": False}},
    # CTranslate2 int8 (the default engine before ONNX Runtime GenAI); the torch runner.
    "ct2": {"completion": {"engine": "ctranslate2"}},
    "torch": {"completion": {"engine": "torch"}},
    # A request that would come too late answered empty at once, without waiting.
    "no_wait": {"completion": {"latencyWaitMs": 0}},
    # The index's embedding model in sentence-transformers (torch) rather than ONNX Runtime.
    "index_torch": {"index": {"embeddingEngine": "torch"}},
    # The background training loop off: what `training` is compared with.
    "no_training": {"training": {"auto": False}},
    # A background training run of the workspace's adapter going on while the person types: due
    # at once (any changed file, no idle wait, whatever the load), the loop's other settings
    # (its thread, priority, memory cap, pausing while completions are served) as they are.
    "training": {"training": {"idleS": 0, "minChangedFiles": 1, "checkEveryS": 1, "maxLoad": 1000}},
}
TRAINING_CONFIGS = ("training",)
"""Configurations whose typing waits until the background run has made a training step."""


def _merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def workspace_for(source: Path, package: str, into: Path) -> Path:
    """A workspace of real code: the typed file beside a standard-library package's files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    into.mkdir()
    if package:
        shutil.copytree(
            stdlib / package, into / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return into / source.name


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    source = stdlib / args.file
    before, text, after = typing_target(source, args.chars)
    keys = cadence(text, random.Random(args.seed))
    results: dict[str, Any] = {}
    completion: dict[str, Any] = setting_overrides(args.set)
    if args.model != "bundled":
        completion["model"] = args.model
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-complete-") as scratch:
        root = Path(scratch)
        storage = Storage(f"sqlite:///{root / 'backend.sqlite3'}")
        token = storage.create_token("bench")
        backend, url = await start_backend(
            f"sqlite:///{root / 'backend.sqlite3'}", root / "backend.log"
        )
        try:
            for name in args.configs.split(","):
                # A fresh workspace and index for each configuration: none starts warm.
                path = workspace_for(source, args.workspace, root / f"workspace-{name}")
                path.write_text(before + after, encoding="utf-8")
                changed: dict[str, Any] = {"backend": {"url": url, "token": token}}
                if args.cache_dir:
                    changed["cacheDir"] = args.cache_dir
                if completion:
                    changed["completion"] = completion
                results[name] = await replay(
                    keys,
                    before,
                    after,
                    path,
                    _merged(changed, CONFIGS[name]),
                    training=name in TRAINING_CONFIGS,
                )
        finally:
            backend.terminate()
            backend.wait(30)
        tenant = storage.tenant_id("bench")
        stored = len(storage.event_ids(tenant)) if tenant is not None else 0
        storage.close()
    report: dict[str, Any] = {
        "benchmark": "complete",
        "command": "tabloop bench complete " + " ".join(args.argv),
        "file": args.file,
        "workspace": args.workspace,
        "chars_typed": len(keys),
        "model": args.model,
        "cpu": cpu_description(),
        "load_average_after": round(os.getloadavg()[0], 2),
        # Events the loopback backend stored from every configuration's server.
        "backend_events_stored": stored,
        **results,
    }
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench complete", description=__doc__)
    parser.add_argument("--model", default="bundled", help="completion model (default bundled)")
    parser.add_argument("--file", default="textwrap.py", help="standard-library file to type")
    parser.add_argument(
        "--workspace",
        default="email",
        help="standard-library package copied into the workspace beside the file ('' for none)",
    )
    parser.add_argument("--chars", type=int, default=1200, help="characters to type")
    parser.add_argument("--configs", default="defaults,gate_open", help=", ".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a completion setting for every configuration (as the editor sends it, e.g. "
        "suffixShare=0.1; the value is JSON); listed under changed_from_defaults",
    )
    parser.add_argument("--cache-dir", help="cache directory (default: the configured one)")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    args.argv = argv
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0
