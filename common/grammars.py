"""The tree-sitter grammars bundled with tabloop (one wheel each), loaded once on first use.

The indexer chunks code with them and the completion engine checks suggestions with them; both
get their parsers here, so a grammar is loaded once per process.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from tree_sitter import Language, Parser

# Grammar name (`common.languages.Language.grammar`) -> (module, function returning the grammar).
WHEELS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}

_lock = threading.Lock()
_languages: dict[str, Language] = {}


def language(name: str) -> Language | None:
    """The loaded grammar `name`, or None when none is bundled for it."""
    wheel = WHEELS.get(name)
    if wheel is None:
        return None
    with _lock:
        loaded = _languages.get(name)
        if loaded is None:
            factory: Callable[[], object] = getattr(importlib.import_module(wheel[0]), wheel[1])
            loaded = _languages[name] = Language(factory())
    return loaded


def parser_for(name: str) -> Parser | None:
    """A new parser for grammar `name`, or None when none is bundled for it."""
    loaded = language(name)
    return None if loaded is None else Parser(loaded)
