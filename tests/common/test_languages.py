"""The one language table: every lookup agrees with it, and nothing in it is ambiguous."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pygls.workspace import Workspace

from common import languages
from completion.fim import comment_lines
from completion.gate import Signals, extract_features
from completion.types import CompletionRequest
from evaluation.holes import Hole
from evaluation.simulation import Position
from indexer.languages import language_of
from lsp_server.documents import adopt
from lsp_server.features.inline import build_request
from lsp_server.oneshot import request_at
from tests.support.languages import ONCE_SKEWED
from training.evaluate import request_for
from training.examples import FimExample


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


def test_aliases_and_ids_name_one_language_each() -> None:
    names = [name for language in languages.LANGUAGES for name in language.aliases]
    assert len(names) == len(set(names))
    assert not set(names) & set(languages.BY_ID)


SAME_FILE = [
    *(pytest.param(f"src/example.{ext}", lsp_id, id=ext) for ext, lsp_id in ONCE_SKEWED.items()),
    pytest.param("scripts/run.sh", "shellscript", id="sh"),
]
SOURCE = "def f(x):\n    return x\n\n\ndef g(y):\n    return f(y)\n"


@pytest.mark.parametrize(("relative", "lsp_id"), SAME_FILE)
def test_the_server_and_every_offline_path_give_the_gate_the_same_features(
    tmp_path: Path, relative: str, lsp_id: str
) -> None:
    """One file, one cursor: the server (with and without the editor's id), `tabloop complete`,
    the held-out evaluation of adapters, `tabloop eval holes` and the replay build requests whose
    gate features are the same (but for `invoked`: the trigger is each path's own)."""
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE, encoding="utf-8")
    line = 4
    offset = SOURCE.index("def g(y):") + len("def g(y):")  # the end of a line: no hole after it
    prefix, suffix = SOURCE[:offset], SOURCE[offset:]
    column = len("def g(y):")

    requests: dict[str, CompletionRequest] = {}
    for editor_id in (lsp_id, ""):
        item = types.TextDocumentItem(
            uri=path.as_uri(), language_id=editor_id, version=1, text=SOURCE
        )
        workspace = Workspace(None)
        workspace.put_text_document(item)
        document = adopt(workspace, item)
        requests[f"server {editor_id or 'without id'}"] = build_request(
            document, types.Position(line, column), "automatic"
        )
    requests["oneshot"] = request_at(path, line, column)
    requests["training"] = request_for(FimExample(relative, prefix, "", suffix, "line"))
    requests["holes"] = Hole(path, prefix, "", suffix, "line", line, column).request()
    requests["replay"] = Position(str(path), prefix, suffix, line, column).request()

    features = {
        name: extract_features(request, "return g(y)", None, Signals())
        for name, request in requests.items()
    }
    for found in features.values():
        found.pop("invoked")
    expected = features["server " + lsp_id]
    assert expected["language"] == lsp_id
    assert features == dict.fromkeys(features, expected)
