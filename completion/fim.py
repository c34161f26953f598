"""Fill-in-the-middle prompt formats, one per model family.

Each family was trained on its own sentinel tokens and spacing; a prompt in the wrong format makes
a code model ramble, so the format follows the model (`detect_family`) unless the user names one.
Families with a multi-file (repository-level) format get snippets from other files in it; the
others get them as commented blocks at the top of the prefix, each under a path header.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from common import languages
from completion.types import Snippet

FAMILIES = ("qwen", "starcoder", "codellama", "deepseek")


def comment_lines(text: str, path: str | None) -> str:
    """`text` as a comment in the language of `path` (`#` when the language is unknown)."""
    language = languages.language_for_path(path) if path else None
    if language is not None and language.block_comment is not None:
        opener, closer = language.block_comment
        # A closer inside the text would end the comment early.
        return f"{opener}\n{text.replace(closer, '')}\n{closer}"
    leader = (language.line_comment if language else None) or "#"
    return "\n".join(f"{leader} {line}".rstrip() for line in text.split("\n"))


def _commented_snippets(snippets: Sequence[Snippet], path: str | None) -> str:
    """Snippets as comment blocks, in the comment syntax of the file being edited."""
    blocks = []
    for snippet in snippets:
        body = snippet.text.rstrip("\n")
        blocks.append(comment_lines(f"Path: {snippet.path}\n{body}", path or snippet.path))
    return "".join(block + "\n\n" for block in blocks)


@dataclass(frozen=True)
class FimTemplate:
    """How one model family wants a fill-in-the-middle prompt written."""

    name: str
    stop_tokens: tuple[str, ...]
    _render: Callable[[str, str, Sequence[Snippet], str | None, str], str] = field(
        repr=False, compare=False
    )
    # The token that follows the text before the cursor: what precedes it is the prefix.
    suffix_marker: str = ""

    def build(
        self,
        prefix: str,
        suffix: str,
        snippets: Sequence[Snippet] = (),
        path: str | None = None,
        repo: str = "",
    ) -> str:
        """The prompt that asks the model for the text between `prefix` and `suffix`.

        `snippets` are code from other files, best first; the prompt holds them in the reverse
        order, so the most relevant stands nearest the edited file. `path` is the edited file's
        path (workspace-relative is best: it is shown to the model), `repo` the workspace's name
        (families with a repository-level format show it).
        """
        return self._render(prefix, suffix, list(reversed(snippets)), path, repo)


def _qwen(
    prefix: str, suffix: str, snippets: Sequence[Snippet], path: str | None, repo: str
) -> str:
    # Qwen2.5-Coder's repository-level format: `<|repo_name|>` and the repository's name, each
    # file after `<|file_sep|>` and its path, the edited file last, its FIM part right after its
    # path line.
    fim = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    if not snippets:
        return fim
    files = "".join(f"<|file_sep|>{s.path}\n{s.text.rstrip(chr(10))}\n" for s in snippets)
    return f"<|repo_name|>{repo or 'workspace'}\n{files}<|file_sep|>{path or 'untitled'}\n{fim}"


def _starcoder(
    prefix: str, suffix: str, snippets: Sequence[Snippet], path: str | None, repo: str
) -> str:
    # StarCoder2's repository format puts the edited file's path inside the FIM prefix.
    if not snippets:
        return f"<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"
    files = "".join(f"<file_sep>{s.path}\n{s.text.rstrip(chr(10))}\n" for s in snippets)
    head = f"{files}<file_sep><fim_prefix>{path or 'untitled'}\n"
    return f"{head}{prefix}<fim_suffix>{suffix}<fim_middle>"


def _codellama(
    prefix: str, suffix: str, snippets: Sequence[Snippet], path: str | None, repo: str
) -> str:
    # Code Llama's infilling format, spaces exactly as in its reference implementation.
    return f"<PRE> {_commented_snippets(snippets, path)}{prefix} <SUF>{suffix} <MID>"


def _deepseek(
    prefix: str, suffix: str, snippets: Sequence[Snippet], path: str | None, repo: str
) -> str:
    # DeepSeek-Coder reads other files as comment-headed code before the hole.
    context = _commented_snippets(snippets, path)
    return f"<｜fim▁begin｜>{context}{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>"


TEMPLATES: dict[str, FimTemplate] = {
    "qwen": FimTemplate(
        "qwen",
        (
            "<|endoftext|>",
            "<|file_sep|>",
            "<|fim_prefix|>",
            "<|fim_suffix|>",
            "<|fim_middle|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|im_end|>",
        ),
        _qwen,
        "<|fim_suffix|>",
    ),
    "starcoder": FimTemplate(
        "starcoder",
        ("<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        _starcoder,
        "<fim_suffix>",
    ),
    "codellama": FimTemplate(
        "codellama", ("<EOT>", "</s>", "<PRE>", "<SUF>", "<MID>"), _codellama, "<SUF>"
    ),
    "deepseek": FimTemplate(
        "deepseek",
        ("<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        _deepseek,
        "<｜fim▁hole｜>",
    ),
}

# Sentinel tokens that identify a family in a tokenizer's vocabulary, most specific first.
_FAMILY_MARKERS: tuple[tuple[str, str], ...] = (
    ("<|fim_prefix|>", "qwen"),
    ("<｜fim▁begin｜>", "deepseek"),
    ("<fim_prefix>", "starcoder"),
    ("<PRE>", "codellama"),
    ("▁<PRE>", "codellama"),
)
_NAME_MARKERS: tuple[tuple[str, str], ...] = (
    ("qwen", "qwen"),
    ("deepseek", "deepseek"),
    ("starcoder", "starcoder"),
    ("santacoder", "starcoder"),
    ("bigcode", "starcoder"),
    ("stable-code", "starcoder"),
    ("codellama", "codellama"),
    ("code-llama", "codellama"),
    ("code_llama", "codellama"),
)


class UnknownFamily(ValueError):
    """The model's FIM format could not be inferred."""


def detect_family(special_tokens: Iterable[str], model_name: str = "") -> str:
    """The model family whose FIM format a tokenizer speaks.

    Sentinel tokens decide first (they are what the model was trained on); the model's name is the
    fallback. Raises `UnknownFamily` when neither says.
    """
    tokens = set(special_tokens)
    for marker, family in _FAMILY_MARKERS:
        if marker in tokens:
            return family
    lowered = model_name.lower()
    for marker, family in _NAME_MARKERS:
        if marker in lowered:
            return family
    raise UnknownFamily(
        f"cannot tell the fill-in-the-middle format of model {model_name or '(unnamed)'!r}: "
        f"set completion.fimTemplate to one of {', '.join(FAMILIES)}"
    )


def template_for(name: str) -> FimTemplate:
    """The template for a template name (`qwen`, …) or a model family/name (`Qwen2.5-Coder`)."""
    key = name.strip().lower()
    if key in TEMPLATES:
        return TEMPLATES[key]
    try:
        return TEMPLATES[detect_family((), key)]
    except UnknownFamily:
        raise UnknownFamily(
            f"unknown fill-in-the-middle template {name!r}; choose one of {', '.join(FAMILIES)}"
        ) from None
