"""Workspace context for the engine: the index, definitions, and recent edits."""

from __future__ import annotations

from indexer.service import WorkspaceIndex
from lsp_server.documents import open_document
from lsp_server.features.index import IndexFeature
from lsp_server.retrieval import WorkspaceContext
from lsp_server.server import TabloopServer


def register(server: TabloopServer) -> None:
    def index() -> WorkspaceIndex | None:
        # Asked per request: the index feature replaces its index when the settings change.
        feature = server.find_feature(IndexFeature)
        return feature.index if feature is not None else None

    def document_text(uri: str) -> str | None:
        document = open_document(server.workspace, uri)
        return document.source if document is not None else None

    context = WorkspaceContext(index, document_text, lambda: server.workspace_root)
    server.add_feature(context)
    server.hooks.documents.append(context.recent)
