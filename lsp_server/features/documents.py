"""Document events: keep the open documents' text, supersede requests, tell the features.

pygls's workspace handles each event first; on `didOpen` its copy of the text is replaced by a
`lsp_server.documents.Document`, which then takes every change incrementally (see there) and
records it in code points: listeners get one `DocumentChange` per `didChange`.
"""

from __future__ import annotations

import logging

from lsprotocol import types

from lsp_server.documents import DocumentChange, adopt, open_document
from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)


def register(server: TabloopServer) -> None:
    # pygls updates its workspace copy before these run.

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TabloopServer, params: types.DidOpenTextDocumentParams) -> None:
        adopt(ls.workspace, params.text_document)
        for listener in ls.hooks.documents:
            _safely(listener.did_open, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TabloopServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        # Work for the old version is wasted: stop it now rather than at the version check.
        ls.cancel_in_flight(uri, "document changed")
        document = open_document(ls.workspace, uri)
        change = (
            document.take_change()
            if document is not None
            else DocumentChange(uri, params.text_document.version)
        )
        for listener in ls.hooks.documents:
            _safely(listener.did_change, change)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TabloopServer, params: types.DidSaveTextDocumentParams) -> None:
        for listener in ls.hooks.documents:
            _safely(listener.did_save, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TabloopServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.cancel_in_flight(uri, "document closed")
        for listener in ls.hooks.documents:
            _safely(listener.did_close, uri)


def _safely(callback: object, *args: object) -> None:
    # One broken listener must not break document sync for the others.
    try:
        callback(*args)  # type: ignore[operator]
    except Exception:
        log.exception("document listener failed")
