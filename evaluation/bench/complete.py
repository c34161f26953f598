"""`tabloop bench complete`: typing a real file, with every cache on and with every cache off.

A simulated person types part of a real standard-library function, character by character, at
a human cadence, into the real server over stdio. Like an editor, the client asks for a
suggestion once typing pauses for 150 ms, and cancels a request still in flight when the next
key arrives. The same keystrokes, with the same timing, are replayed against a server with its
caches on (KV-prefix reuse, typing-through) and one with them off, in the same run.

Reported for each, under `on` and `off`:
- `keystroke_to_suggestion_ms_p50/p95`: from the keystroke before a pause to a suggestion on
  screen (the 150 ms pause included), over requests that were answered;
- `model_calls_per_100_keystrokes`;
- `prefill_tokens_per_call`: prompt tokens the model computed per call (the KV cache serves the
  rest);
- `overhead_ms_p50`: the client's round trip minus the server's time in the model runner.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import random
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types

from evaluation.bench.lsp import percentile
from evaluation.lsp_client import TabloopClient, plain
from lsp_server.protocol import TIMINGS_REQUEST

PAUSE_S = 0.150
THINK_S = 1.0


@dataclass(frozen=True)
class Keystroke:
    char: str
    gap_s: float  # time since the previous keystroke


def typing_target(path: Path, max_chars: int) -> tuple[str, str, str]:
    """(text before, text to type, text after): the body of a real function, cut short."""
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


async def replay(
    keys: list[Keystroke],
    before: str,
    after: str,
    path: Path,
    model: str,
    cache: bool,
    max_new_tokens: int,
    cache_dir: Path | None,
) -> dict[str, Any]:
    client = TabloopClient()
    await client.launch(
        path.parent,
        {
            **({"cacheDir": str(cache_dir)} if cache_dir else {}),
            "completion": {"model": model, "cache": cache, "maxNewTokens": max_new_tokens},
            "policy": {"showFloor": 1.0},
            "index": {"enabled": False},
            "telemetry": {"level": "off"},
        },
    )
    status = await client.wait_until_ready(900)
    if status["model"]["state"] != "ready":
        raise RuntimeError(f"model not ready: {status['model']}")
    uri = client.open(path, before + after)
    start_model = status["model"]
    typed = before
    latencies: list[float] = []
    overheads: list[float] = []
    pending: asyncio.Task[Any] | None = None
    pending_started = 0.0
    keystroke_at = 0.0
    answered = cancelled = 0
    model_ms: list[float] = []

    async def last_model_ms() -> float:
        timings = await client.protocol.send_request_async(TIMINGS_REQUEST, {})
        return float(plain(timings[-1])["model_ms"]) if timings else 0.0

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

    for number, key in enumerate(keys):
        # Wait out the gap; if it is a pause, the editor asks for a suggestion meanwhile.
        next_gap = keys[number + 1].gap_s if number + 1 < len(keys) else 1.0
        position = position_after(typed)
        client.insert(uri, position.line, position.character, key.char)
        typed += key.char
        keystroke_at = time.perf_counter()
        if pending is not None and not pending.done():
            client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending.get_name()))
            cancelled += 1
        pending = None
        if next_gap >= PAUSE_S:
            await asyncio.sleep(PAUSE_S)
            msg_id = f"k{number}-{'on' if cache else 'off'}"
            pending_started = time.perf_counter()
            pending = asyncio.get_running_loop().create_task(
                ask(position_after(typed), msg_id), name=msg_id
            )
            # A quick pause ends with the next key, which cancels what is in flight; at a
            # thinking pause the person reads the suggestion, so it is waited for.
            wait_s = 60.0 if next_gap >= THINK_S else next_gap - PAUSE_S
            done, _ = await asyncio.wait({pending}, timeout=wait_s)
            if done:
                answered += 1
                answer = None if pending.exception() else pending.result()
                now = time.perf_counter()
                if answer is not None and answer.items:
                    latencies.append((now - keystroke_at) * 1000)
                    overheads.append((now - pending_started) * 1000)
                    model_ms.append(await last_model_ms())
                rest = next_gap - (now - keystroke_at)
                if rest > 0:
                    await asyncio.sleep(rest)
            else:
                pending.add_done_callback(lambda task: task.cancelled() or task.exception())
        else:
            await asyncio.sleep(next_gap)
    if pending is not None and not pending.done():
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending.get_name()))
        await asyncio.wait({pending}, timeout=60)
    status = await client.status()
    await client.close_server()
    model_status = status["model"]
    calls = model_status["calls"] - start_model["calls"]
    return {
        "keystrokes": len(keys),
        "requests_answered": answered,
        "requests_cancelled": cancelled,
        "suggestions_shown": len(latencies),
        "keystroke_to_suggestion_ms_p50": round(percentile(latencies, 0.5), 1),
        "keystroke_to_suggestion_ms_p95": round(percentile(latencies, 0.95), 1),
        "model_calls_per_100_keystrokes": round(100 * calls / len(keys), 1),
        "prefill_tokens_per_call": round(
            (model_status["prefillTokens"] - start_model["prefillTokens"]) / max(calls, 1), 1
        ),
        "overhead_ms_p50": round(
            percentile([rt - m for rt, m in zip(overheads, model_ms, strict=True)], 0.5), 2
        ),
        "typing_cache_hits": model_status["typingCacheHits"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    source = stdlib / args.file
    before, text, after = typing_target(source, args.chars)
    keys = cadence(text, random.Random(args.seed))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-complete-") as scratch:
        path = Path(scratch) / "workspace" / source.name
        path.parent.mkdir()
        path.write_text(before + after, encoding="utf-8")
        # The default cache directory: the bundled model is assembled there once.
        cache_dir = Path(args.cache_dir) if args.cache_dir else None
        for name, cache in (("on", True), ("off", False)):
            results[name] = await replay(
                keys, before, after, path, args.model, cache, args.max_new_tokens, cache_dir
            )
    on, off = results["on"], results["off"]
    return {
        **results,
        "speedup_p50": round(
            off["keystroke_to_suggestion_ms_p50"] / on["keystroke_to_suggestion_ms_p50"], 2
        )
        if on["keystroke_to_suggestion_ms_p50"] > 0
        else None,
        "file": args.file,
        "chars_typed": len(keys),
        "model": args.model,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench complete", description=__doc__)
    parser.add_argument("--model", default="bundled", help="completion model (default bundled)")
    parser.add_argument("--file", default="textwrap.py", help="standard-library file to type")
    parser.add_argument("--chars", type=int, default=120, help="characters to type")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", help="cache directory (default: the configured one)")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0
