"""The syntax check in place: kept, cut at a line break, dropped, or not checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from completion import gate
from completion.engine import Engine
from completion.postprocess import SYNTAX_DROPPED
from completion.settings import CompletionSettings
from completion.syntax import KEPT_TREES, SyntaxChecker, grammar_for
from completion.types import CompletionRequest
from tests.support.scripted_model import ScriptedModel

PREFIX = "def total(items):\n    result = 0\n    for item in items:\n        "
SUFFIX = "\n    return result\n\n\ndef other():\n    return 1\n"


def request(
    prefix: str = PREFIX, suffix: str = SUFFIX, language: str = "python"
) -> CompletionRequest:
    return CompletionRequest(prefix=prefix, suffix=suffix, language=language, path="m.py")


@pytest.mark.parametrize(
    ("suggestion", "text", "outcome"),
    [
        pytest.param("result += item", "result += item", "kept", id="fits"),
        pytest.param(
            "result += item\n        print(result",
            "result += item",
            "cut",
            id="unclosed-bracket-on-line-two",
        ),
        pytest.param(
            "result += item\n        if item:\n            count(\n",
            "result += item\n        if item:",
            "cut",
            id="longest-start-that-parses",
        ),
        pytest.param("result += (item", "", "dropped", id="broken-first-line"),
        pytest.param("   ", "   ", "unchecked", id="blank"),
    ],
)
def test_check_in_place(suggestion: str, text: str, outcome: str) -> None:
    verdict = SyntaxChecker().check(request(), suggestion)
    assert (verdict.text, verdict.outcome) == (text, outcome)


def test_a_line_already_broken_at_the_cursor_does_not_drop_the_suggestion() -> None:
    # The user is mid-statement: the original has an error on the cursor's line, so a suggestion
    # that leaves it broken there introduces nothing new.
    broken = request(prefix=PREFIX + "result += foo(", suffix=SUFFIX)
    verdict = SyntaxChecker().check(broken, "item")
    assert verdict.outcome == "kept"
    assert verdict.text == "item"
    fixed = SyntaxChecker().check(broken, "item)")
    assert fixed.outcome == "kept"


def test_errors_after_the_insertion_are_compared_line_for_line() -> None:
    # The suffix holds an error of its own, lines below the cursor: it does not count against a
    # two-line suggestion, although the suggestion moves it down.
    suffix = SUFFIX + "\ndef broken(:\n    pass\n"
    verdict = SyntaxChecker().check(request(suffix=suffix), "result += item\n        print(result)")
    assert verdict.outcome == "kept"


def test_other_languages_and_unknown_ones() -> None:
    js = request(prefix="function f(a) {\n  return ", suffix="\n}\n", language="javascript")
    assert SyntaxChecker().check(js, "a + 1;").outcome == "kept"
    assert SyntaxChecker().check(js, "a + (1;").outcome == "dropped"
    plain = request(prefix="hello ", suffix="", language="plaintext")
    assert SyntaxChecker().check(plain, "((((").outcome == "unchecked"
    assert grammar_for("typescriptreact") == "tsx"
    assert grammar_for("python") == "python"
    assert grammar_for("plaintext") is None


def test_incremental_parse_matches_a_full_parse() -> None:
    from common import grammars

    checker = SyntaxChecker()
    suggestion = "result += item\n        print(result"
    verdict = checker.check(request(), suggestion)
    parser = grammars.parser_for("python")
    assert parser is not None
    full = parser.parse((PREFIX + verdict.text + SUFFIX).encode())
    assert not full.root_node.has_error
    assert verdict.parses == 3  # the original, the whole suggestion, its first line


def _typing(source: str, start: int, typed: str) -> list[CompletionRequest]:
    """The requests of a user typing `typed` at `start` in `source`, one character each."""
    return [
        CompletionRequest(
            prefix=source[:start] + typed[:count],
            suffix=source[start:],
            language="python",
            uri="file:///typed.py",
        )
        for count in range(len(typed) + 1)
    ]


SUGGESTIONS = ["item)", "result += item\n        print(result", "x = (\n", "return result"]


def test_keystrokes_reparse_from_the_document_tree_with_the_same_verdicts() -> None:
    # A user types a line into a real module: each check starts from the document's last tree,
    # and says exactly what a checker that parses every text from nothing says.
    import textwrap as module

    source = Path(module.__file__).read_text(encoding="utf-8")
    start = source.index("\n", source.index("def dedent(")) + 1
    kept, cold = SyntaxChecker(), SyntaxChecker()
    verdicts = []
    for typed in _typing(source, start, "    total = sum(len(line) for line in "):
        for suggestion in SUGGESTIONS:
            warm = kept.check(typed, suggestion)
            fresh = cold.check(dataclasses.replace(typed, uri="", path=None), suggestion)
            assert (warm.text, warm.outcome) == (fresh.text, fresh.outcome)
            verdicts.append(warm)
    assert not verdicts[0].reused
    assert all(verdict.reused for verdict in verdicts[1:])
    assert {verdict.outcome for verdict in verdicts} >= {"kept", "cut", "dropped"}


def test_the_kept_tree_is_the_tree_of_the_new_text() -> None:
    # Edits anywhere (a deletion far above the cursor, a paste, an edit at the very start or
    # end): the tree re-parsed from the last one equals a full parse of the new text.
    from common import grammars

    parser = grammars.parser_for("python")
    assert parser is not None
    checker = SyntaxChecker()
    texts = [
        PREFIX + SUFFIX,
        "import os\n" + PREFIX + SUFFIX,
        "import os\n" + PREFIX + "value = (\n" + SUFFIX,
        PREFIX.replace("result = 0", "result = []") + SUFFIX + "def tail(:\n",
        "",
        PREFIX + SUFFIX,
    ]
    for text in texts:
        checker.check(CompletionRequest(prefix=text, suffix="", language="python", uri="u"), "x")
        kept = checker._kept()["u"]
        assert kept.text == text.encode()
        assert str(kept.tree.root_node) == str(parser.parse(text.encode()).root_node)


def test_trees_are_kept_for_a_bounded_number_of_documents() -> None:
    checker = SyntaxChecker()
    for number in range(KEPT_TREES + 3):
        checker.check(request_in(f"file:///m{number}.py"), "result += item")
    assert list(checker._kept()) == [f"file:///m{n}.py" for n in range(3, KEPT_TREES + 3)]
    again = checker.check(request_in("file:///m0.py"), "result += item")
    assert not again.reused


def request_in(uri: str) -> CompletionRequest:
    return CompletionRequest(prefix=PREFIX, suffix=SUFFIX, language="python", uri=uri)


@pytest.mark.parametrize(
    ("check", "text", "syntax", "cut_feature"),
    [
        pytest.param(True, "result += item", "cut", 1.0, id="on"),
        pytest.param(False, "result += item\n        print(result", "unchecked", 0.0, id="off"),
    ],
)
def test_engine_applies_the_check_and_reports_it(
    check: bool, text: str, syntax: str, cut_feature: float
) -> None:
    model = ScriptedModel(rules={"items:\n": "        result += item\n        print(result"})
    always = gate.builtin_policy().with_floor(1.0)
    settings = CompletionSettings(
        model="scripted", cache=False, syntax_check=check, typing_max_lines=2
    )
    engine = Engine(settings, model, policy_source=lambda: always)
    decision = engine.complete(request())
    assert decision.text == text
    assert decision.syntax == syntax
    assert decision.features["syntax_cut"] == cut_feature
    assert (decision.timings.syntax_ms > 0) is check


def test_engine_drops_a_suggestion_that_only_breaks_code() -> None:
    model = ScriptedModel(rules={"items:\n": "        result += (item"})
    settings = CompletionSettings(model="scripted", cache=False)
    engine = Engine(settings, model)
    decision = engine.complete(request())
    assert decision.text == ""
    assert decision.syntax == "dropped"
    assert decision.reason == SYNTAX_DROPPED
    assert decision.action == "silence"


def test_error_recovery_that_wraps_earlier_code_is_not_a_new_error() -> None:
    # Characters Python does not allow (U+2028, U+0085) break line 1 already; with the
    # suggestion, tree-sitter's recovery wraps the code from line 0 in an error node, which holds
    # only whole statements: nothing new is wrong on line 0.
    source = "page = 1\f\nmark\u2028 = 2 \x85 # note\n    result = "
    verdict = SyntaxChecker().check(request(prefix=source, suffix=""), "sum(values)")
    assert verdict.outcome == "kept"
