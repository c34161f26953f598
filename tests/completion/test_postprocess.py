"""Stop rules and cleaning of model output, on realistic editor situations."""

from __future__ import annotations

import pytest

from completion.postprocess import clean, stop_rule
from completion.types import CompletionRequest


def request(prefix: str, suffix: str = "\n", language: str = "python") -> CompletionRequest:
    return CompletionRequest(prefix=prefix, suffix=suffix, language=language)


def stopped(text: str, req: CompletionRequest) -> str:
    """What the decode loop keeps: the text cut where the rule first fires, token by token."""
    rule = stop_rule(req)
    for end in range(1, len(text) + 1):
        cut = rule(text[:end])
        if cut is not None:
            return text[:cut]
    return text


PY_FUNC = "def mean(values):\n    "
PY_NEXT_DEF = "\n\n\ndef median(values):\n    pass\n"


@pytest.mark.parametrize(
    ("req", "generated", "kept"),
    [
        pytest.param(
            request("result = compute(", ")\nprint(result)\n"),
            "a, b)\nprint(a)",
            "a, b)",
            id="code-after-cursor-single-line",
        ),
        pytest.param(
            request(PY_FUNC, PY_NEXT_DEF),
            "total = sum(values)\n    return total / len(values)\n\n\ndef median(values):\n",
            "total = sum(values)\n    return total / len(values)",
            id="python-dedent-ends-body",
        ),
        pytest.param(
            request("def mean(values):", PY_NEXT_DEF),
            "\n    total = sum(values)\n    return total\ndef other():\n",
            "\n    total = sum(values)\n    return total",
            id="python-block-opened-on-cursor-line",
        ),
        pytest.param(
            request("def mean(values):", PY_NEXT_DEF),
            "\ndef other():\n    pass\n",
            "",
            id="python-opener-without-body",
        ),
        pytest.param(
            request("class A:\n    def f(self):\n        if x:\n            "),
            "y = 1\n        z = 2\n",
            "y = 1",
            id="python-nested-dedent",
        ),
        pytest.param(
            request("for item in items:\n    "),
            "if item:\n        print(item)\n\n    else:\n        pass\n",
            "if item:\n        print(item)\n\n    else:\n        pass\n",
            id="python-deeper-lines-and-blank-lines-continue",
        ),
        pytest.param(
            request("function add(a, b) {\n  ", "\n}\n", "javascript"),
            "const s = a + b;\n  return s;\n}\n\nfunction sub(a, b) {\n",
            "const s = a + b;\n  return s;",
            id="js-closing-brace-already-in-suffix",
        ),
        pytest.param(
            request("function add(a, b) {", "\n\nadd(1, 2);\n", "javascript"),
            "\n  return a + b;\n}\n\nfunction sub(a, b) {\n",
            "\n  return a + b;\n}",
            id="js-suggestion-closes-the-block-it-opens",
        ),
        pytest.param(
            request("fn main() {\n    ", "\n}\n", "rust"),
            'let v = vec![1, 2];\n    if v.len() > 1 {\n        println!("{}", "}");\n    }\n}\n',
            'let v = vec![1, 2];\n    if v.len() > 1 {\n        println!("{}", "}");\n    }',
            id="rust-braces-in-strings-ignored",
        ),
        pytest.param(
            request("int main() {\n    return foo(", "\n}\n", "c"),
            "1, 2);\n}\n",
            "1, 2);",
            id="c-unclosed-paren-from-prefix-is-not-the-block-end",
        ),
    ],
)
def test_stop_rule(req: CompletionRequest, generated: str, kept: str) -> None:
    assert stopped(generated, req) == kept


def test_stop_rule_caps_lines() -> None:
    req = request("x = [\n")
    text = "".join(f"    {n},\n" for n in range(40))
    assert stop_rule(req, max_lines=5)(text) == len("".join(f"    {n},\n" for n in range(5))) - 1


def test_a_suggestion_at_the_end_of_a_line_writes_the_next_line() -> None:
    # The cursor ends a line: the suggestion's first line break is not a line of its own.
    req = request("def mean(values):\n    total = sum(values)", "\n")
    text = "\n    count = len(values)\n    return total / count\n"
    assert stopped(text, req) == text  # the default 16 lines: all of it
    one = stop_rule(req, max_lines=1)
    assert text[: one(text)] == "\n    count = len(values)"
    two = stop_rule(req, max_lines=2)
    assert text[: two(text)] == "\n    count = len(values)\n    return total / count"
    at_line_start = stop_rule(request(PY_FUNC), max_lines=1)
    body = "total = sum(values)\n    return total\n"
    assert body[: at_line_start(body)] == "total = sum(values)"


def test_stop_rule_waits_for_a_complete_line() -> None:
    # The last line may still grow its indentation: "  " could become "        return".
    rule = stop_rule(request(PY_FUNC))
    assert rule("x = 1\n  ") is None


@pytest.mark.parametrize(
    ("req", "text", "expected"),
    [
        pytest.param(
            request(PY_FUNC),
            "return sum(values) / len(values)",
            "return sum(values) / len(values)",
            id="good-suggestion-unchanged",
        ),
        pytest.param(request(PY_FUNC), "   \n\t\n", "", id="whitespace-only"),
        pytest.param(request(PY_FUNC), "", "", id="empty"),
        pytest.param(
            request(PY_FUNC),
            "return x   \n\n\n",
            "return x",
            id="trailing-whitespace-and-blank-lines",
        ),
        pytest.param(
            request(PY_FUNC),
            "x = 1  \n    y = 2\t\n",
            "x = 1\n    y = 2",
            id="trailing-space-per-line",
        ),
        pytest.param(request(PY_FUNC), "x", "", id="below-min-chars"),
        pytest.param(
            request("print(compute(", "))\n"), "a, b))", "a, b", id="suffix-closers-overlap"
        ),
        pytest.param(
            request("value = int(", ")\n"), "text.strip())", "text.strip()", id="keeps-own-paren"
        ),
        pytest.param(request("value = int(", ")\n"), "text)", "text", id="drops-borrowed-paren"),
        pytest.param(request('name = "', '"\n'), 'world"', "world", id="quote-overlap"),
        pytest.param(request("x = f(", ")\n"), "g(y)", "g(y)", id="balanced-kept"),
        pytest.param(
            request(PY_FUNC, "\n    return total\n"),
            "total = sum(values)\n    return total",
            "total = sum(values)",
            id="repeats-following-line",
        ),
        pytest.param(
            request(PY_FUNC, "\n    return total\n\n\ndef f():\n    pass\n"),
            "total = 0\n    for v in values:\n        total += v\n    return total",
            "total = 0\n    for v in values:\n        total += v",
            id="repeats-following-line-among-more",
        ),
        pytest.param(
            request(PY_FUNC, "return total\n"), "return total", "", id="equals-start-of-suffix"
        ),
        pytest.param(
            request("def f():\n", "    return 1\n"), "    return 1", "", id="equals-next-line"
        ),
        pytest.param(
            request(PY_FUNC),
            "x = 1\n    x = 1\n    x = 1\n    x = 1\n    x = 1",
            "x = 1",
            id="same-line-repeated",
        ),
        pytest.param(
            request(PY_FUNC),
            "a = 1\n    b = 2\n    a = 1\n    b = 2\n    a = 1\n    b = 2\n    a = 1",
            "a = 1\n    b = 2",
            id="two-line-loop",
        ),
        pytest.param(
            request(PY_FUNC),
            "return self.self.self.self.self.self.self.self",
            "return self.",
            id="token-loop",
        ),
        pytest.param(
            request(PY_FUNC), "return f(x)))))))))))))))))", "return f(x)", id="char-loop"
        ),
        pytest.param(request("    # "), "=" * 40, "=" * 40, id="comment-rule-is-not-a-loop"),
        pytest.param(
            request("x = compute(", ")\nprint(x)\n"),
            "ab)\nprint(x)",
            "ab",
            id="single-line-enforced-again",
        ),
    ],
)
def test_clean(req: CompletionRequest, text: str, expected: str) -> None:
    assert clean(text, req, min_chars=2) == expected


def test_clean_min_chars_counts_non_blank_characters() -> None:
    req = request(PY_FUNC)
    assert clean("a  b", req, min_chars=3) == ""
    assert clean("a  bc", req, min_chars=3) == "a  bc"
