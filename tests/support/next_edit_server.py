"""A scripted language server speaking only the next-edit protocol, for the editor clients' tests.

It advertises `capabilities.experimental.tabloop.nextEdit`, keeps the documents the editor opens
and changes (pygls's workspace), and answers `textDocument/copilotInlineEdit` (and
`tabloop/nextEdit`) from a script: the first rule whose `when` text occurs in the document gives
the prediction. A request for an old
version of the document, or a document no rule fits, is answered `{"edits": []}`. Everything the
client sends about next edits (requests, cancellations, shows, rejections, `tabloop.acceptNextEdit`)
is recorded and answered to the `scripted/log` request, so a test reads what the client did;
`scripted/document` (`{"uri": ...}`) answers the server's copy of a document's text. It also
answers `textDocument/inlineCompletion` (each request recorded too): ghost text from the script's
`inline` rules, none by default.

    python -m tests.support.next_edit_server --script FILE   # LSP on stdin/stdout

The script (JSON): `{"rules": [{"when": str, "edits": [EDIT, ...]}], "delay_ms": 0}`, where EDIT
is `{"find": str, "replace": str}` (every occurrence of `find` replaced) or `{"before": str,
"insert": str}` (`insert` put in before the first occurrence of `before`); a rule without edits
answers no change. `delay_ms` holds every answer back (a slow model), so that a test can see a
request cancelled by the next one. `"inline": [{"when": str, "text": str}]`: an inline completion
request whose cursor line holds `when` is answered `text` inserted at the cursor (the first rule
that fits; no items otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from lsp_server.protocol import (
    ACCEPT_NEXT_EDIT_COMMAND,
    CONFIGURATION_SECTION,
    DID_SHOW_INLINE_EDIT_NOTIFICATION,
    NEXT_EDIT_CAPABILITY,
    NEXT_EDIT_REJECTED_NOTIFICATION,
    NEXT_EDIT_REQUEST,
    NEXT_EDIT_SHOWN_NOTIFICATION,
    TABLOOP_NEXT_EDIT_REQUEST,
    plain,
)

NEXT_EDIT_METHODS = (NEXT_EDIT_REQUEST, TABLOOP_NEXT_EDIT_REQUEST)
SHOWN_METHODS = (DID_SHOW_INLINE_EDIT_NOTIFICATION, NEXT_EDIT_SHOWN_NOTIFICATION)
REJECTED = NEXT_EDIT_REJECTED_NOTIFICATION
ACCEPT = ACCEPT_NEXT_EDIT_COMMAND
LOG_REQUEST = "scripted/log"
DOCUMENT_REQUEST = "scripted/document"


@dataclass(frozen=True)
class ScriptedEdit:
    """Every occurrence of `find` replaced by `text`; `insert_only`: `text` before the first."""

    find: str
    text: str
    insert_only: bool = False

    @classmethod
    def read(cls, data: dict[str, str]) -> ScriptedEdit:
        if "before" in data:
            return cls(data["before"], data["insert"], insert_only=True)
        return cls(data["find"], data["replace"])


@dataclass(frozen=True)
class Rule:
    """A prediction: used when `when` occurs in the document."""

    when: str
    edits: tuple[ScriptedEdit, ...]


@dataclass
class Script:
    rules: list[Rule] = field(default_factory=list)
    delay_ms: int = 0
    inline: list[tuple[str, str]] = field(default_factory=list)
    """Ghost text: (`when` on the cursor's line, the text inserted at the cursor)."""

    @classmethod
    def read(cls, path: Path) -> Script:
        data = json.loads(path.read_text(encoding="utf-8"))
        rules = [
            Rule(rule["when"], tuple(ScriptedEdit.read(edit) for edit in rule["edits"]))
            for rule in data.get("rules", [])
        ]
        inline = [(rule["when"], rule["text"]) for rule in data.get("inline", [])]
        return cls(rules, int(data.get("delay_ms", 0)), inline)


def position_at(text: str, offset: int) -> dict[str, int]:
    """The LSP position (UTF-16 characters) of `offset` in `text`."""
    before = text[:offset]
    line = before.count("\n")
    start = before.rfind("\n") + 1
    return {"line": line, "character": len(before[start:].encode("utf-16-le")) // 2}


def predicted_edits(script: Script, text: str, uri: str, version: int) -> list[dict[str, Any]]:
    """The items of the first rule that fits `text`, sorted by position, all with one id."""
    rule = next((rule for rule in script.rules if rule.when in text), None)
    if rule is None:
        return []
    found: list[tuple[int, int, str]] = []
    for edit in rule.edits:
        start = text.find(edit.find)
        if edit.insert_only and start >= 0:
            found.append((start, start, edit.text))
            continue
        while edit.find and start >= 0:
            found.append((start, start + len(edit.find), edit.text))
            start = text.find(edit.find, start + len(edit.find))
    prediction = uuid.uuid4().hex
    return [
        {
            "id": prediction,
            "textDocument": {"uri": uri, "version": version},
            "range": {"start": position_at(text, start), "end": position_at(text, end)},
            "text": replace,
            "command": {
                "title": "Accept next edit",
                "command": ACCEPT,
                "arguments": [prediction],
            },
        }
        for start, end, replace in sorted(found)
    ]


class ScriptedProtocol(LanguageServerProtocol):
    """pygls's protocol, with the next-edit capability added to the `initialize` answer."""

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(
        self, params: types.InitializeParams
    ) -> Generator[Any, Any, types.InitializeResult]:
        result: types.InitializeResult = yield from super().lsp_initialize(params)
        result.capabilities.experimental = {CONFIGURATION_SECTION: {NEXT_EDIT_CAPABILITY: True}}
        return result


def create_server(script: Script) -> LanguageServer:
    server = LanguageServer("tabloop-scripted-next-edit", "0", protocol_cls=ScriptedProtocol)
    log: list[dict[str, Any]] = []

    async def next_edit(method: str, params: Any) -> dict[str, Any]:
        params = plain(params)
        entry: dict[str, Any] = {"method": method, "params": params, "outcome": "pending"}
        log.append(entry)
        try:
            await asyncio.sleep(script.delay_ms / 1000)
        except asyncio.CancelledError:
            entry["outcome"] = "cancelled"
            raise
        document = server.workspace.get_text_document(params["textDocument"]["uri"])
        version = params["textDocument"].get("version")
        if document.version != version:
            entry["outcome"] = "stale"
            return {"edits": []}
        edits = predicted_edits(script, document.source, document.uri, version)
        entry["outcome"] = "answered"
        entry["edits"] = edits
        return {"edits": edits}

    for method in NEXT_EDIT_METHODS:

        @server.feature(method)
        async def answer(params: Any, method: str = method) -> dict[str, Any]:
            return await next_edit(method, params)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    def inline_completion(params: types.InlineCompletionParams) -> types.InlineCompletionList:
        document = server.workspace.get_text_document(params.text_document.uri)
        here = params.position
        lines = document.lines
        line = lines[here.line] if here.line < len(lines) else ""
        text = next((text for when, text in script.inline if when in line), None)
        log.append(
            {
                "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
                "triggerKind": int(params.context.trigger_kind),
                "position": {"line": here.line, "character": here.character},
                "version": document.version,
                "answered": text is not None,
            }
        )
        items = (
            []
            if text is None
            else [types.InlineCompletionItem(text, range=types.Range(here, here))]
        )
        return types.InlineCompletionList(items)

    for method in (*SHOWN_METHODS, REJECTED):

        @server.feature(method)
        def record(params: Any, method: str = method) -> None:
            log.append({"method": method, "params": plain(params)})

    @server.command(ACCEPT)
    def accept(*arguments: Any) -> None:
        log.append(
            {
                "method": types.WORKSPACE_EXECUTE_COMMAND,
                "command": ACCEPT,
                "arguments": list(arguments),
            }
        )

    @server.feature(LOG_REQUEST)
    def read_log(_params: Any) -> list[dict[str, Any]]:
        return log

    @server.feature(DOCUMENT_REQUEST)
    def read_document(params: Any) -> str:
        return server.workspace.get_text_document(plain(params)["uri"]).source

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, required=True, help="the script (JSON)")
    args = parser.parse_args(argv)
    create_server(Script.read(args.script)).start_io()


if __name__ == "__main__":
    main()
