"""What the client can do, resolved once at `initialize` (ruff's `ResolvedClientCapabilities`).

Features read these fields instead of walking the raw `ClientCapabilities` each time; a server
that has not been initialized (tests, the CLI) has them all off.
"""

from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types


@dataclass(frozen=True)
class ResolvedClientCapabilities:
    """The client capabilities the server acts on."""

    work_done_progress: bool = False
    """`$/progress` with server-created tokens (`window.workDoneProgress`)."""

    inline_completion: bool = False
    """`textDocument/inlineCompletion`: the completion fallback stays empty for such clients."""

    workspace_configuration: bool = False
    """`workspace/configuration`: the server pulls the `tabloop` section."""

    @classmethod
    def resolve(cls, capabilities: types.ClientCapabilities) -> ResolvedClientCapabilities:
        window, document = capabilities.window, capabilities.text_document
        workspace = capabilities.workspace
        return cls(
            work_done_progress=bool(window and window.work_done_progress),
            inline_completion=bool(document and document.inline_completion),
            workspace_configuration=bool(workspace and workspace.configuration),
        )
