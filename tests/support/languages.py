"""Kinds of files whose language the offline paths once named otherwise than the server.

`tabloop complete`, the adapters' held-out evaluation and `tabloop eval holes` named a file's
language by its tree-sitter grammar or extension (`tsx`, `javascript`, `rb`, `cs`) where the
server named it by the LSP id the gate has a column for. Extension -> the LSP id all must give.
"""

from __future__ import annotations

ONCE_SKEWED: dict[str, str] = {
    "py": "python",
    "tsx": "typescriptreact",
    "jsx": "javascriptreact",
    "rb": "ruby",
    "cs": "csharp",
}
