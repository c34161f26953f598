"""One table of languages: LSP language ids, file extensions, comment syntax, tree-sitter
grammar, indentation.

A request's language is always an LSP id (`CompletionRequest.language`): the editor's, or the one
this table gives the file's extension where no editor gave one (`request_language`), so the
server, `tabloop complete`, the evaluations and training encode a file alike. The index chunks by
grammar, the FIM templates write other files' snippets as comments, the gate tells languages
apart by LSP id, post-processing ends blocks by indentation where the language does, and the
evaluation picks files by language: all of them read this table, so a language added here is
known everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Language:
    """A language as tabloop knows it."""

    lsp_id: str
    """The LSP `languageId` editors send (`python`, `typescriptreact`, …)."""
    extensions: tuple[str, ...]
    """File extensions, lower case, without the dot."""
    line_comment: str | None = None
    block_comment: tuple[str, str] | None = None
    grammar: str | None = None
    """The tree-sitter grammar the index chunks it with (None: line windows)."""
    indented: bool = False
    """Blocks are delimited by indentation rather than brackets."""
    aliases: tuple[str, ...] = ()
    """Other ids editors send for it (Neovim sends its filetype: `cs`, `sh`)."""


def _lang(
    lsp_id: str,
    *extensions: str,
    line: str | None = None,
    block: tuple[str, str] | None = None,
    grammar: str | None = None,
    indented: bool = False,
    aliases: tuple[str, ...] = (),
) -> Language:
    return Language(lsp_id, extensions, line, block, grammar, indented, aliases)


LANGUAGES: tuple[Language, ...] = (
    _lang("python", "py", "pyi", line="#", grammar="python", indented=True),
    _lang("javascript", "js", "mjs", "cjs", line="//", grammar="javascript"),
    _lang("javascriptreact", "jsx", line="//", grammar="javascript"),
    _lang("typescript", "ts", "mts", "cts", line="//", grammar="typescript"),
    _lang("typescriptreact", "tsx", line="//", grammar="tsx"),
    _lang("go", "go", line="//", grammar="go"),
    _lang("rust", "rs", line="//", grammar="rust"),
    _lang("java", "java", line="//", grammar="java"),
    _lang("c", "c", "h", line="//", grammar="c"),
    _lang("cpp", "cc", "cpp", "cxx", "hpp", "hh", "hxx", line="//", grammar="cpp"),
    _lang("csharp", "cs", line="//", aliases=("cs",)),
    _lang("kotlin", "kt", "kts", line="//"),
    _lang("scala", "scala", line="//"),
    _lang("swift", "swift", line="//"),
    _lang("dart", "dart", line="//"),
    _lang("php", "php", line="//"),
    _lang("zig", "zig", line="//"),
    _lang("proto", "proto", line="//"),
    _lang("shellscript", "sh", "bash", "zsh", line="#", aliases=("sh", "bash", "zsh")),
    _lang("ruby", "rb", line="#"),
    _lang("perl", "pl", line="#"),
    _lang("r", "r", line="#"),
    _lang("yaml", "yaml", "yml", line="#", indented=True),
    _lang("toml", "toml", line="#"),
    _lang("ini", "cfg", "ini", line="#"),
    _lang("makefile", "mk", line="#", aliases=("make",)),
    _lang("cmake", "cmake", line="#"),
    _lang("dockerfile", "dockerfile", line="#"),
    _lang("nim", "nim", line="#", indented=True),
    _lang("coffeescript", "coffee", line="#", indented=True),
    _lang("gdscript", "gd", line="#", indented=True),
    _lang("julia", "jl", line="#"),
    _lang("elixir", "ex", "exs", line="#"),
    _lang("terraform", "tf", line="#"),
    _lang("powershell", "ps1", line="#", aliases=("ps1",)),
    _lang("lua", "lua", line="--"),
    _lang("sql", "sql", line="--"),
    _lang("haskell", "hs", line="--", indented=True),
    _lang("elm", "elm", line="--", indented=True),
    _lang("ada", "ada", line="--"),
    _lang("vhdl", "vhdl", line="--"),
    _lang("lisp", "lisp", line=";"),
    _lang("clojure", "clj", "cljs", line=";"),
    _lang("emacs-lisp", "el", line=";"),
    _lang("scheme", "scm", line=";"),
    _lang("asm", "asm", "s", line=";"),
    _lang("latex", "tex", line="%", aliases=("tex",)),
    _lang("erlang", "erl", line="%"),
    _lang("matlab", "m", line="%"),
    _lang("vim", "vim", line='"'),
    _lang("html", "html", "htm", block=("<!--", "-->")),
    _lang("xml", "xml", "svg", block=("<!--", "-->")),
    _lang("vue", "vue", block=("<!--", "-->")),
    _lang("markdown", "md", block=("<!--", "-->")),
    _lang("css", "css", block=("/*", "*/")),
    _lang("scss", "scss", block=("/*", "*/")),
    _lang("sass", "sass", line="//", indented=True),
    _lang("pug", "pug", line="//", indented=True),
    _lang("fsharp", "fs", "fsi", "fsx", line="//", indented=True),
    _lang("ocaml", "ml", block=("(*", "*)")),
)

# Files known by their whole name rather than an extension.
SPECIAL_FILENAMES: dict[str, str] = {
    "makefile": "makefile",
    "dockerfile": "dockerfile",
    "cmakelists.txt": "cmake",
}

DOCUMENT_LANGUAGES = frozenset({"markdown", "latex", "html", "xml", "yaml", "toml", "ini"})
"""Languages of the table whose files are prose, markup or settings rather than a program's
source."""
SOURCE_LANGUAGES: tuple[str, ...] = tuple(
    language.lsp_id for language in LANGUAGES if language.lsp_id not in DOCUMENT_LANGUAGES
)
"""The LSP ids of the source languages: every language of the table but `DOCUMENT_LANGUAGES`."""

BY_ID: dict[str, Language] = {language.lsp_id: language for language in LANGUAGES}
BY_EDITOR_ID: dict[str, Language] = {
    **{alias: language for language in LANGUAGES for alias in language.aliases},
    **BY_ID,
}
BY_EXTENSION: dict[str, Language] = {
    extension: language for language in LANGUAGES for extension in language.extensions
}


def _name(path: str) -> str:
    return PurePosixPath(path.replace("\\", "/")).name.lower()


def extension_of(path: str) -> str:
    """The lower-case extension of `path` without the dot ("" when it has none)."""
    name = _name(path)
    return name.rsplit(".", 1)[-1] if "." in name else ""


def language_for_path(path: str) -> Language | None:
    """The language of a file, by its name or extension; None when the table does not know it."""
    name = _name(path)
    if name in SPECIAL_FILENAMES:
        return BY_ID[SPECIAL_FILENAMES[name]]
    return BY_EXTENSION.get(extension_of(path))


def lsp_id_for_path(path: str, default: str = "plaintext") -> str:
    """The LSP language id editors would send for `path`."""
    language = language_for_path(path)
    return language.lsp_id if language else default


def request_language(editor_id: str | None, path: str | None) -> str:
    """The LSP id of a request: the id the editor gave (an alias mapped to its LSP id; one the
    table does not know passes unchanged), else the id of `path`'s extension (`plaintext` when
    the table does not know it either). Everything that builds a `CompletionRequest` asks here."""
    if editor_id:
        known = BY_EDITOR_ID.get(editor_id)
        return known.lsp_id if known is not None else editor_id
    return lsp_id_for_path(path or "")


def is_indented(lsp_id: str, path: str | None = None) -> bool:
    """Whether blocks of the language (by LSP id, else by `path`) are delimited by indentation."""
    language = BY_ID.get(lsp_id.lower()) or (language_for_path(path) if path else None)
    return language is not None and language.indented


def extensions_for(lsp_ids: Iterable[str]) -> tuple[str, ...]:
    """The file extensions (with the dot, sorted) of the languages `lsp_ids` (LSP ids or the
    aliases editors send). Raises ValueError naming an id the table does not know."""
    extensions: set[str] = set()
    for lsp_id in lsp_ids:
        language = BY_EDITOR_ID.get(lsp_id)
        if language is None:
            raise ValueError(f"unknown language {lsp_id!r} (an LSP id such as python or go)")
        extensions.update(f".{extension}" for extension in language.extensions)
    return tuple(sorted(extensions))
