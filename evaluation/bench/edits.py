"""What one keystroke in a big document costs the event loop, against pygls's own documents.

A generated Python file of `--lines` lines (100,000 make about 6 MB) is opened in a server built
in-process by `create_server`, and `--edits` one-character insertions in its middle go through
the server's whole `didChange` handling (pygls's workspace, then every feature's listener).

The baseline, measured in the same run on the same text and edits, is the document work alone
that pygls's `TextDocument` does per change as the server used it before `lsp_server.documents`:
applying the change to the workspace copy, and to a second copy (telemetry's shadow) after
converting the range's two ends to offsets. It leaves out everything else the server does, so
`speedup` understates the gain rather than flatters it.

    python -m evaluation.bench.edits [--lines 100000] [--edits 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, cast

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

from lsp_server.features import create_server


def big_text(lines: int) -> str:
    return "".join(
        f"    value_{i} = compute(value_{i - 1}, 'text')  # note\n" for i in range(lines)
    )


def insertion(line: int, column: int) -> types.TextDocumentContentChangePartial:
    at = types.Position(line=line, character=column)
    return types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text="x")


def pygls_ms(text: str, line: int, edits: int) -> float:
    """Mean milliseconds per change of pygls's document work, as the server did it before."""
    workspace_copy, shadow = TextDocument("file:///bench.py", text), TextDocument("file:///b", text)
    started = time.perf_counter()
    for column in range(edits):
        change = insertion(line, column)
        workspace_copy.apply_change(change)
        shadow.offset_at_position(change.range.start)
        shadow.offset_at_position(change.range.end)
        shadow.apply_change(change)
    return (time.perf_counter() - started) * 1000 / edits


async def server_ms(text: str, line: int, edits: int) -> float:
    """Mean milliseconds per `didChange` through the whole server, as it is now."""
    server = create_server()
    protocol = server.protocol
    protocol._workspace = Workspace(None)  # what `initialize` makes; no client here
    uri = "file:///bench.py"
    item = types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
    # pygls's RPCMessage protocol types `method` as plain str; lsprotocol's is a Literal.
    protocol.handle_message(
        cast(
            Any, types.DidOpenTextDocumentNotification(params=types.DidOpenTextDocumentParams(item))
        )
    )
    for _ in range(3):
        await asyncio.sleep(0)  # let the open finish before the clock starts
    started = time.perf_counter()
    for column in range(edits):
        protocol.handle_message(
            cast(
                Any,
                types.DidChangeTextDocumentNotification(
                    params=types.DidChangeTextDocumentParams(
                        text_document=types.VersionedTextDocumentIdentifier(
                            uri=uri, version=column
                        ),
                        content_changes=[insertion(line, column)],
                    )
                ),
            )
        )
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0)
    assert server.workspace.get_text_document(uri).source.count("x" * edits) == 1
    return elapsed * 1000 / edits


def main(argv: list[str] | None = None) -> int:
    """Measure both and print one JSON report."""
    parser = argparse.ArgumentParser(prog="tabloop bench edits", description=__doc__)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--baseline-edits", type=int, default=10)
    args = parser.parse_args(argv)
    text = big_text(args.lines)
    middle = args.lines // 2
    now = asyncio.run(server_ms(text, middle, args.edits))
    before = pygls_ms(text, middle, args.baseline_edits)
    report = {
        "document_bytes": len(text.encode()),
        "edits": args.edits,
        "server_ms_per_edit": round(now, 4),
        "baseline_pygls_ms_per_edit": round(before, 2),
        "speedup": round(before / now, 1),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
