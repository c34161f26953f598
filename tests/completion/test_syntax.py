"""The syntax check in place: kept, cut at a line break, dropped, or not checked."""

from __future__ import annotations

import pytest

from completion import gate
from completion.engine import Engine
from completion.postprocess import SYNTAX_DROPPED
from completion.settings import CompletionSettings
from completion.syntax import SyntaxChecker, grammar_for
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
    settings = CompletionSettings(model="scripted", cache=False, syntax_check=check)
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
