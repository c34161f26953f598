"""`tabloop bench complete`: typing a real file, with every cache on and with every cache off.

A simulated person types part of a real standard-library function, character by character, at
a human cadence, into the real server over stdio. Like an editor, the client asks for a
suggestion once typing pauses for 150 ms, and cancels a request still in flight when the next
key arrives. The same keystrokes, with the same timing, are replayed against a server with its
caches on (the prompt start's model state kept across keystrokes, typing-through) and one with
them off, in the same run.

At a thinking pause, the person takes (Tab) a suggestion that is exactly what they were about to
type, and the editor asks again at once; that request is where the prefetch pays.

Reported for each configuration (`on`: the defaults; `off`: every cache and the prefetch off;
`torch_reuse`: the torch runner with its KV-prefix reuse; `ct2`: the defaults on CTranslate2;
`no_wait`, asked with `--configs`: the
defaults with `completion.latencyWaitMs` 0, a request that would come too late answered empty at
once):
- `model_served_ms_p50/p95`: from the keystroke before a pause to a suggestion on screen (the
  150 ms pause included), over suggestions a model call produced (not typing-through or prefetch
  hits, counted apart as `typing_cache_served` and `prefetch_served`);
- `keystroke_to_suggestion_ms_p50/p95`: the same over every suggestion shown;
- `model_served_parts_p50`: where those suggestions' time went in the server (median handler,
  latency wait, context, model, prompt read and decode milliseconds, tokens read and written),
  and `model_served_each` the same for each of them, with its keystroke-to-screen `ms`;
- `latency_skips`: requests answered empty at once because the suggestion would come too late;
- `model_calls_per_100_keystrokes`;
- `prefill_tokens_per_call`: prompt tokens the model computed per call (the KV cache serves the
  rest);
- `overhead_ms_p50`: the client's round trip minus the server's time in the model runner;
- `server_rss_mb`, `server_peak_rss_mb`: the language server's resident memory at the end and at
  its peak.
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

from completion.types import LATENCY_SKIP
from evaluation.bench.engines import server_memory_mb
from evaluation.bench.lsp import percentile
from evaluation.holes import setting_overrides
from evaluation.lsp_client import TabloopClient, plain
from lsp_server.protocol import TIMINGS_REQUEST

PAUSE_S = 0.150
THINK_S = 1.0


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


async def replay(
    keys: list[Keystroke],
    before: str,
    after: str,
    path: Path,
    completion: dict[str, Any],
    cache_dir: Path | None,
) -> dict[str, Any]:
    client = TabloopClient()
    await client.launch(
        path.parent,
        {
            **({"cacheDir": str(cache_dir)} if cache_dir else {}),
            "completion": completion,
            "policy": {"showFloor": 1.0},
            "index": {"enabled": False},
            "telemetry": {"level": "off"},
        },
    )
    status = await client.wait_until_ready(900)
    if status["model"]["state"] != "ready":
        raise RuntimeError(f"model not ready: {status['model']}")
    uri = client.open(path, before + after)
    start_status = status
    start_model = status["model"]
    text = "".join(key.char for key in keys)
    typed = before
    latencies: dict[str, list[float]] = {"model": [], "typing": [], "prefetch": []}
    overheads: list[float] = []
    pending: asyncio.Task[Any] | None = None
    pending_started = 0.0
    keystroke_at = 0.0
    answered = cancelled = accepted = latency_skips = 0
    model_ms: list[float] = []
    parts: list[dict[str, Any]] = []  # the server's timing records of model-served suggestions

    async def last_timing() -> dict[str, Any]:
        timings = await client.protocol.send_request_async(TIMINGS_REQUEST, {})
        return dict(plain(timings[-1])) if timings else {}

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

    number = 0
    request_number = 0
    tag = "on" if completion.get("cache", True) else "off"
    while number < len(keys):
        key = keys[number]
        # Wait out the gap; if it is a pause, the editor asks for a suggestion meanwhile.
        next_gap = keys[number + 1].gap_s if number + 1 < len(keys) else 1.0
        position = position_after(typed)
        client.insert(uri, position.line, position.character, key.char)
        typed += key.char
        number += 1
        keystroke_at = time.perf_counter()
        if pending is not None and not pending.done():
            client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending.get_name()))
            cancelled += 1
        pending = None
        while next_gap >= PAUSE_S:
            await asyncio.sleep(PAUSE_S)
            request_number += 1
            msg_id = f"k{request_number}-{tag}"
            pending_started = time.perf_counter()
            pending = asyncio.get_running_loop().create_task(
                ask(position_after(typed), msg_id), name=msg_id
            )
            # A quick pause ends with the next key, which cancels what is in flight; at a
            # thinking pause the person reads the suggestion, so it is waited for.
            wait_s = 60.0 if next_gap >= THINK_S else next_gap - PAUSE_S
            done, _ = await asyncio.wait({pending}, timeout=wait_s)
            if not done:
                pending.add_done_callback(lambda task: task.cancelled() or task.exception())
                break
            answered += 1
            answer = None if pending.exception() else pending.result()
            now = time.perf_counter()
            record = await last_timing()
            if record.get("reason") == LATENCY_SKIP:
                latency_skips += 1
            suggestion = answer.items[0].insert_text if answer is not None and answer.items else ""
            if suggestion:
                source = record.get("cache_source") or "model"
                latencies[source].append((now - keystroke_at) * 1000)
                if source == "model":
                    parts.append(record)
                overheads.append((now - pending_started) * 1000)
                model_ms.append(float(record.get("model_ms", 0.0)))
            # At a thinking pause the person takes a suggestion that says exactly what they were
            # about to type (Tab), and the editor asks again at once after it.
            rest_of_text = text[number:]
            if next_gap >= THINK_S and suggestion and rest_of_text.startswith(suggestion):
                position = position_after(typed)
                client.insert(uri, position.line, position.character, suggestion)
                typed += suggestion
                number += len(suggestion)
                accepted += 1
                keystroke_at = time.perf_counter()
                continue
            rest = next_gap - (now - keystroke_at)
            if rest > 0:
                await asyncio.sleep(rest)
            break
        else:
            await asyncio.sleep(next_gap)
    if pending is not None and not pending.done():
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=pending.get_name()))
        await asyncio.wait({pending}, timeout=60)
    status = await client.status()
    memory = server_memory_mb(client)
    await client.close_server()
    model_status = status["model"]
    calls = model_status["calls"] - start_model["calls"]
    served = [x for found in latencies.values() for x in found]
    prefetch_used = status.get("prefetchUsed", 0) - start_status.get("prefetchUsed", 0)
    return {
        "completion": completion,
        "keystrokes": len(keys),
        "requests_answered": answered,
        "requests_cancelled": cancelled,
        "suggestions_shown": len(served),
        "suggestions_accepted": accepted,
        "latency_skips": latency_skips,
        "model_served": len(latencies["model"]),
        "typing_cache_served": len(latencies["typing"]),
        "prefetch_served": len(latencies["prefetch"]),
        "prefetch_share_of_shown": round(len(latencies["prefetch"]) / max(len(served), 1), 3),
        "prefetch_used_after_accept": round(prefetch_used / max(accepted, 1), 3),
        "model_served_ms_p50": _quantile(latencies["model"], 0.5),
        "model_served_ms_p95": _quantile(latencies["model"], 0.95),
        # Where a model-served suggestion's time goes, medians over them (server side).
        "model_served_parts_p50": {
            name: _quantile([float(part.get(name, 0.0)) for part in parts], 0.5) for name in _PARTS
        },
        # Each model-served suggestion: keystroke to screen, and the server's parts of it.
        "model_served_each": [
            {"ms": round(ms, 1), **{k: _rounded(v) for k, v in part.items() if k in _PARTS}}
            for ms, part in zip(latencies["model"], parts, strict=True)
        ],
        "keystroke_to_suggestion_ms_p50": _quantile(served, 0.5),
        "keystroke_to_suggestion_ms_p95": _quantile(served, 0.95),
        "model_calls_per_100_keystrokes": round(100 * calls / len(keys), 1),
        "prefill_tokens_per_call": round(
            (model_status["prefillTokens"] - start_model["prefillTokens"]) / max(calls, 1), 1
        ),
        "overhead_ms_p50": _quantile(
            [rt - m for rt, m in zip(overheads, model_ms, strict=True)], 0.5, digits=2
        ),
        "typing_cache_hits": model_status["typingCacheHits"],
        "server_rss_mb": memory["rss_mb"],
        "server_peak_rss_mb": memory["peak_rss_mb"],
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


def _rounded(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value


def _quantile(values: list[float], q: float, digits: int = 1) -> float | None:
    """The q-quantile of `values`, rounded; None (JSON null) when there are none."""
    return round(percentile(values, q), digits) if values else None


CONFIGS: dict[str, dict[str, Any]] = {
    # The default settings (the fast engine, every cache on), then with every cache off, then the
    # torch runner with its KV-prefix reuse: does reuse on short edits beat a faster engine?
    "on": {},
    "off": {"cache": False, "prefetch": False},
    "torch_reuse": {"engine": "torch"},
    # The defaults on CTranslate2 int8 (the default engine before ONNX Runtime GenAI).
    "ct2": {"engine": "ctranslate2"},
    # Latency-aware skipping answering empty at once, without waiting for the pause to grow.
    "no_wait": {"latencyWaitMs": 0},
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    source = stdlib / args.file
    before, text, after = typing_target(source, args.chars)
    keys = cadence(text, random.Random(args.seed))
    results: dict[str, Any] = {}
    base: dict[str, Any] = {"model": args.model, **setting_overrides(args.set)}
    if args.max_new_tokens:
        base["maxNewTokens"] = args.max_new_tokens
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-complete-") as scratch:
        path = Path(scratch) / "workspace" / source.name
        path.parent.mkdir()
        path.write_text(before + after, encoding="utf-8")
        # The default cache directory: the bundled model is assembled there once.
        cache_dir = Path(args.cache_dir) if args.cache_dir else None
        for name in args.configs.split(","):
            results[name] = await replay(
                keys, before, after, path, {**base, **CONFIGS[name]}, cache_dir
            )
    report: dict[str, Any] = {
        "benchmark": "complete",
        "command": "tabloop bench complete " + " ".join(args.argv),
        **results,
        "file": args.file,
        "chars_typed": len(keys),
        "model": args.model,
    }
    on, off = results.get("on"), results.get("off")
    if on and off and on["model_served_ms_p50"] and off["model_served_ms_p50"]:
        report["model_served_speedup_p50"] = round(
            off["model_served_ms_p50"] / on["model_served_ms_p50"], 2
        )
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench complete", description=__doc__)
    parser.add_argument("--model", default="bundled", help="completion model (default bundled)")
    parser.add_argument("--file", default="textwrap.py", help="standard-library file to type")
    parser.add_argument("--chars", type=int, default=120, help="characters to type")
    parser.add_argument(
        "--max-new-tokens", type=int, default=0, help="0 keeps the server's default"
    )
    parser.add_argument("--configs", default="on,off,torch_reuse", help=", ".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a completion setting for every configuration (as the editor sends it, e.g. "
        "suffixShare=0.1; the value is JSON)",
    )
    parser.add_argument("--cache-dir", help="cache directory (default: the configured one)")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    args.argv = argv
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0
