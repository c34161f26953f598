"""LSP features; each module has `register(server)`, and `create_server` registers them all.

The server (`lsp_server.server`) knows no feature; each feature module imports it for
`TabloopServer`. Features find each other through `server.feature_of(cls)`.
"""

from __future__ import annotations

from lsp_server.features import (
    adapters,
    commands,
    documents,
    edit_learning,
    index,
    inline,
    learning,
    lifecycle,
    next_edit,
    policy,
    prefetch,
    retrieval,
    session,
    telemetry,
    training_loop,
)
from lsp_server.server import TabloopServer


def create_server() -> TabloopServer:
    """A server with every feature registered, in this order."""
    server = TabloopServer()
    policy.register(server)
    lifecycle.register(server)
    documents.register(server)
    prefetch.register(server)
    inline.register(server)
    commands.register(server)
    telemetry.register(server)
    session.register(server)  # after telemetry: a decision's event before its outcomes
    next_edit.register(server)
    retrieval.register(server)
    index.register(server)
    learning.register(server)
    edit_learning.register(server)  # after next_edit: its history has an edit when told of it
    adapters.register(server)
    training_loop.register(server)  # after adapters: it asks them to look at a promotion
    return server
