"""The one language table: every lookup agrees with it, and nothing in it is ambiguous."""

from __future__ import annotations

import pytest

from common import languages
from completion.fim import comment_lines
from indexer.languages import language_of


def test_no_extension_or_id_is_listed_twice() -> None:
    extensions = [ext for language in languages.LANGUAGES for ext in language.extensions]
    assert len(extensions) == len(set(extensions))
    ids = [language.lsp_id for language in languages.LANGUAGES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("path", "lsp_id", "grammar", "comment"),
    [
        pytest.param("pkg/mod.py", "python", "python", "# x", id="python"),
        pytest.param("App.TSX", "typescriptreact", "tsx", "// x", id="tsx-upper-case"),
        pytest.param("view.jsx", "javascriptreact", "javascript", "// x", id="jsx"),
        pytest.param("lib.h", "c", "c", "// x", id="c-header"),
        pytest.param("init.lua", "lua", "lua", "-- x", id="lua-no-grammar"),
        pytest.param("Makefile", "makefile", "text", "# x", id="special-name"),
        pytest.param("page.html", "html", "html", "<!--\nx\n-->", id="block-comment"),
        pytest.param("notes.unknown", "plaintext", "unknown", "# x", id="unknown"),
    ],
)
def test_every_package_reads_the_same_table(
    path: str, lsp_id: str, grammar: str, comment: str
) -> None:
    assert languages.lsp_id_for_path(path) == lsp_id
    # The index names a file's language by its grammar, else by its extension.
    assert language_of(path) == grammar
    assert comment_lines("x", path) == comment
