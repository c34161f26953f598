"""Workspace context for the engine: the index, definitions, and recent edits."""

from __future__ import annotations

from typing import Any

from lsp_server.retrieval import WorkspaceContext
from lsp_server.server import TabloopServer


def register(server: TabloopServer) -> None:
    def index() -> Any:
        return server.extensions.get("index")

    def document_text(uri: str) -> str | None:
        document = server.workspace.text_documents.get(uri)
        return document.source if document is not None else None

    context = WorkspaceContext(index, document_text, lambda: server.workspace_root)
    server.extensions["context"] = context
    server.hooks.documents.append(context.recent)
