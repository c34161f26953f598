"""FIM prompt formats per family, family detection, snippet placement."""

from __future__ import annotations

import pytest

from completion.fim import UnknownFamily, comment_lines, detect_family, template_for
from completion.types import Snippet

PREFIX = "def area(r):\n    "
SUFFIX = "\n\nprint(area(2))\n"
SNIPPETS = (
    Snippet("pkg/consts.py", "PI = 3.14159\n"),
    Snippet("pkg/util.py", "def sq(x):\n    return x * x"),
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "qwen", f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>", id="qwen"
        ),
        pytest.param(
            "starcoder", f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>", id="starcoder"
        ),
        pytest.param("codellama", f"<PRE> {PREFIX} <SUF>{SUFFIX} <MID>", id="codellama"),
        pytest.param(
            "deepseek", f"<｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>", id="deepseek"
        ),
    ],
)
def test_build_without_snippets(name: str, expected: str) -> None:
    assert template_for(name).build(PREFIX, SUFFIX) == expected


# SNIPPETS are best first: the prompt holds them in reverse, the best nearest the edited file.
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "qwen",
            "<|repo_name|>geometry\n"
            "<|file_sep|>pkg/util.py\ndef sq(x):\n    return x * x\n"
            "<|file_sep|>pkg/consts.py\nPI = 3.14159\n"
            f"<|file_sep|>pkg/geo.py\n<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",
            id="qwen-repo-level",
        ),
        pytest.param(
            "starcoder",
            "<file_sep>pkg/util.py\ndef sq(x):\n    return x * x\n"
            "<file_sep>pkg/consts.py\nPI = 3.14159\n"
            f"<file_sep><fim_prefix>pkg/geo.py\n{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>",
            id="starcoder-repo-level",
        ),
        pytest.param(
            "codellama",
            "<PRE> # Path: pkg/util.py\n# def sq(x):\n#     return x * x\n\n"
            "# Path: pkg/consts.py\n# PI = 3.14159\n\n"
            f"{PREFIX} <SUF>{SUFFIX} <MID>",
            id="codellama-commented",
        ),
        pytest.param(
            "deepseek",
            "<｜fim▁begin｜># Path: pkg/util.py\n# def sq(x):\n#     return x * x\n\n"
            "# Path: pkg/consts.py\n# PI = 3.14159\n\n"
            f"{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>",
            id="deepseek-commented",
        ),
    ],
)
def test_build_with_snippets(name: str, expected: str) -> None:
    assert template_for(name).build(PREFIX, SUFFIX, SNIPPETS, "pkg/geo.py", "geometry") == expected


def test_qwen_names_a_repository_when_none_is_known() -> None:
    prompt = template_for("qwen").build(PREFIX, SUFFIX, SNIPPETS[:1], "pkg/geo.py")
    assert prompt.startswith("<|repo_name|>workspace\n<|file_sep|>pkg/consts.py\n")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("a.py", "# Path: x\n# y = 1", id="python"),
        pytest.param("src/main.rs", "// Path: x\n// y = 1", id="rust"),
        pytest.param("web/app.TS", "// Path: x\n// y = 1", id="typescript-upper-ext"),
        pytest.param("db/q.sql", "-- Path: x\n-- y = 1", id="sql"),
        pytest.param("Makefile", "# Path: x\n# y = 1", id="makefile"),
        pytest.param("index.html", "<!--\nPath: x\ny = 1\n-->", id="html-block"),
        pytest.param(None, "# Path: x\n# y = 1", id="unknown-path"),
    ],
)
def test_comment_syntax_follows_language(path: str | None, expected: str) -> None:
    assert comment_lines("Path: x\ny = 1", path) == expected


def test_commented_snippets_use_edited_files_language() -> None:
    prompt = template_for("codellama").build(
        "fn main() {", "}", [Snippet("lib.py", "x = 1")], "main.rs"
    )
    assert "// Path: lib.py\n// x = 1\n" in prompt


def test_blank_lines_in_comments_have_no_trailing_space() -> None:
    assert comment_lines("a\n\nb", "x.py") == "# a\n#\n# b"


@pytest.mark.parametrize(
    ("tokens", "name", "family"),
    [
        pytest.param(["<|fim_prefix|>", "<|endoftext|>"], "", "qwen", id="qwen-tokens"),
        pytest.param(["<fim_prefix>", "<file_sep>"], "", "starcoder", id="starcoder-tokens"),
        pytest.param(["▁<PRE>", "▁<SUF>"], "", "codellama", id="codellama-tokens"),
        pytest.param(["<｜fim▁begin｜>"], "", "deepseek", id="deepseek-tokens"),
        pytest.param([], "Qwen/Qwen2.5-Coder-1.5B", "qwen", id="qwen-name"),
        pytest.param([], "bigcode/starcoder2-3b", "starcoder", id="starcoder-name"),
        pytest.param([], "codellama/CodeLlama-7b-hf", "codellama", id="codellama-name"),
        pytest.param([], "deepseek-ai/deepseek-coder-1.3b-base", "deepseek", id="deepseek-name"),
        pytest.param(["<fim_prefix>"], "my-qwen-finetune", "starcoder", id="tokens-beat-name"),
    ],
)
def test_detect_family(tokens: list[str], name: str, family: str) -> None:
    assert detect_family(tokens, name) == family


def test_detect_family_unknown_names_the_setting() -> None:
    with pytest.raises(UnknownFamily, match="fimTemplate"):
        detect_family(["<s>", "</s>"], "gpt2")


@pytest.mark.parametrize(
    ("name", "template"),
    [
        pytest.param("qwen", "qwen", id="template-name"),
        pytest.param("Qwen2.5-Coder", "qwen", id="family-name"),
        pytest.param(" StarCoder ", "starcoder", id="case-and-space"),
        pytest.param("CodeLlama-7b", "codellama", id="codellama-model"),
    ],
)
def test_template_for(name: str, template: str) -> None:
    assert template_for(name).name == template


def test_template_for_unknown() -> None:
    with pytest.raises(UnknownFamily, match="unknown fill-in-the-middle template 'gpt'"):
        template_for("gpt")


@pytest.mark.parametrize("name", ["qwen", "starcoder", "codellama", "deepseek"])
def test_stop_tokens_include_the_templates_own_sentinels(name: str) -> None:
    template = template_for(name)
    prompt = template.build("a", "b")
    sentinels = [token for token in template.stop_tokens if token in prompt]
    assert sentinels, "a model echoing a sentinel of its own prompt must stop"
