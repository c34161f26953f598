"""Prompt budgeting: shares, anchored prefix windows, suffix lines, snippets."""

from __future__ import annotations

import pytest

from completion.context import (
    ANCHOR_LINES,
    ContextBudget,
    LineTokenCounter,
    TypedIndent,
    assemble,
    fit_prefix,
    fit_snippets,
    fit_suffix,
    typed_indent,
)
from completion.types import CompletionRequest, Generation, Snippet


def words(text: str) -> int:
    """A stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def numbered(n: int, start: int = 0) -> str:
    return "".join(f"line {i} of the file\n" for i in range(start, start + n))  # 5 tokens each


@pytest.mark.parametrize(
    ("total", "shares", "suffix", "snippets", "prefix_if_empty"),
    [
        pytest.param(1000, (0.6, 0.2, 0.2), 200, 200, 1000, id="defaults"),
        pytest.param(1024, (0.6, 0.2, 0.2), 204, 204, 1024, id="default-1024"),
        pytest.param(1000, (3, 1, 1), 200, 200, 1000, id="shares-scaled"),
        pytest.param(1000, (1, 0, 0), 0, 0, 1000, id="prefix-only"),
        pytest.param(100, (0.5, 0.5, 0), 50, 0, 100, id="no-snippets"),
    ],
)
def test_budget_shares(
    total: int,
    shares: tuple[float, float, float],
    suffix: int,
    snippets: int,
    prefix_if_empty: int,
) -> None:
    budget = ContextBudget(total, *shares)
    assert budget.suffix_tokens == suffix
    assert budget.snippet_tokens == snippets
    # What the suffix and snippets leave unused goes to the prefix.
    assert budget.prefix_tokens(0, 0) == prefix_if_empty
    assert budget.prefix_tokens(suffix, snippets) == total - suffix - snippets


@pytest.mark.parametrize(
    ("lines", "budget", "kept_lines"),
    [
        pytest.param(10, 100, 10, id="all-fits"),
        pytest.param(100, 50, 10, id="whole-lines-only"),
        pytest.param(100, 52, 10, id="no-partial-line"),
        pytest.param(3, 0, 0, id="zero-budget"),
    ],
)
def test_suffix_keeps_whole_lines_from_the_cursor(lines: int, budget: int, kept_lines: int) -> None:
    text, used = fit_suffix(numbered(lines), budget, LineTokenCounter(words))
    assert text == numbered(kept_lines)
    assert used == 5 * kept_lines <= max(budget, 0)


def test_suffix_cuts_an_over_long_cursor_line_by_characters() -> None:
    line = "a " * 50 + "\nnext\n"
    text, used = fit_suffix(line, 10, LineTokenCounter(words))
    assert line.startswith(text) and 0 < used <= 10


@pytest.mark.parametrize("budget", [97, 160, 400])
def test_prefix_is_a_tail_within_budget_that_starts_on_an_anchor(budget: int) -> None:
    prefix = numbered(200) + "    total = "
    counter = LineTokenCounter(words)
    text, used = fit_prefix(prefix, budget, counter)
    assert prefix.endswith(text)
    assert used == counter(text) <= budget
    first_line = prefix[: len(prefix) - len(text)].count("\n")
    assert first_line % ANCHOR_LINES == 0
    # The anchor costs at most ANCHOR_LINES lines of context.
    assert used > budget - 5 * ANCHOR_LINES - 5


def test_prefix_shorter_than_an_anchor_span_keeps_whole_lines() -> None:
    prefix = numbered(200) + "    total = "
    text, used = fit_prefix(prefix, 25, LineTokenCounter(words))
    assert text == numbered(4, 196) + "    total = "
    assert used == 22


def test_prefix_window_stays_put_while_typing() -> None:
    counter = LineTokenCounter(words)
    base = numbered(300)
    starts = set()
    for typed in ("r", "re", "ret", "retu", "retur", "return", "return x"):
        prefix = base + "    " + typed
        text, _ = fit_prefix(prefix, 300, counter)
        starts.add(len(prefix) - len(text))
    assert len(starts) == 1  # the KV-prefix cache can keep matching


def test_line_counter_counts_each_line_once() -> None:
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return words(text)

    counter = LineTokenCounter(counting)
    fit_prefix(numbered(50) + "x = ", 100, counter)
    first = len(calls)
    fit_prefix(numbered(50) + "x = 1", 100, counter)
    assert len(calls) == first + 1  # only the edited line is new


def test_snippets_in_order_within_budget_without_duplicates() -> None:
    snippets = [
        Snippet("a.py", "def a():\n    return 1\n", 0.9),
        Snippet("b.py", "x " * 100, 0.8),  # too big: skipped, later ones still considered
        Snippet("c.py", "def a():\n    return 1\n", 0.7),  # same text as the first
        Snippet("d.py", "def d():\n    pass\n", 0.6),
        Snippet("e.py", "   \n", 0.5),  # blank
    ]
    chosen, used = fit_snippets(snippets, 30, LineTokenCounter(words))
    assert [s.path for s in chosen] == ["a.py", "d.py"]
    assert used <= 30


def test_a_long_definition_is_cut_to_its_head_when_asked() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(40))
    definition = Snippet("d.py", "def parse(text, strict=False):\n" + body, 1.0, "definition")
    similar = Snippet("s.py", "def s():\n" + body, 0.9)
    counter = LineTokenCounter(words)
    assert fit_snippets([definition, similar], 30, counter) == ([], 0)
    chosen, used = fit_snippets([definition, similar], 30, counter, heads=True)
    assert [s.path for s in chosen] == ["d.py"]  # a chunk found by meaning is never cut
    head = chosen[0].text
    assert head.startswith("def parse(text, strict=False):\n") and definition.text.startswith(head)
    assert head.endswith("\n") and len(head) < len(definition.text)
    assert used <= 30 and used == counter("d.py\n" + head) + 2
    # The remaining lines did not fit: one more would have gone over.
    next_line = definition.text[len(head) :].splitlines(keepends=True)[0]
    assert used + counter(next_line) > 30


class FixedSource:
    def __init__(self, snippets: list[Snippet]) -> None:
        self.found = snippets

    def snippets(self, request: CompletionRequest, deadline: float) -> list[Snippet]:
        return self.found


def test_assemble_respects_every_share() -> None:
    request = CompletionRequest(prefix=numbered(400), suffix=numbered(400, 400), language="python")
    source = FixedSource([Snippet(f"m{i}.py", numbered(8, i * 10), 1.0) for i in range(20)])
    counter = LineTokenCounter(words)
    parts = assemble(
        request, ContextBudget(1000, 0.6, 0.2, 0.2), count_tokens=counter, source=source
    )
    assert parts.suffix_tokens <= 200
    assert parts.snippets
    assert parts.prefix_tokens + parts.suffix_tokens + parts.snippet_tokens <= 1000
    assert request.prefix.endswith(parts.prefix) and request.suffix.startswith(parts.suffix)
    # The prefix keeps at least its share and starts on an anchor line.
    assert parts.prefix_tokens >= 600 - ANCHOR_LINES * 5
    assert (400 - parts.prefix.count("\n")) % ANCHOR_LINES == 0


@pytest.mark.parametrize("share", [0.0, 0.2])
def test_snippets_fill_what_the_anchored_prefix_leaves(share: float) -> None:
    # 410 lines: the prefix would fit from line 260 but starts on the anchor line 272.
    request = CompletionRequest(prefix=numbered(410), suffix=numbered(50, 410), language="python")
    small = [Snippet(f"m{i}.py", f"def f{i}(x):\n    return x\n", 0.9) for i in range(100)]
    counter = LineTokenCounter(words)
    budget = ContextBudget(1000, 0.6, 0.2, share)
    alone = assemble(request, budget, count_tokens=counter)
    parts = assemble(request, budget, count_tokens=counter, source=FixedSource(small))
    assert alone.snippets == [] and alone.prefix_tokens < 1000 - alone.suffix_tokens
    if share == 0.0:
        # Snippets take nothing from the code around the cursor: the prefix is the same.
        assert parts.prefix == alone.prefix
    assert parts.snippets and parts.snippets == small[: len(parts.snippets)]  # best first
    used = parts.prefix_tokens + parts.suffix_tokens + parts.snippet_tokens
    each = counter("m0.py\n") + 2 + counter(small[0].text)
    assert used <= 1000 and used + each > 1000  # no room was left for one more


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        pytest.param("    return x", ("return x", 4), id="the-typed-indent"),
        pytest.param("        return x", ("    return x", 4), id="deeper"),
        pytest.param("  return x", ("return x", 2), id="shallower"),
        pytest.param("return x", ("return x", 0), id="none"),
        pytest.param("\n    pass", ("\n    pass", 0), id="a-blank-line-first"),
        pytest.param("    ", None, id="only-indent-so-far"),
    ],
)
def test_typed_indent_splits_the_models_indentation(
    generated: str, expected: tuple[str, int] | None
) -> None:
    request = CompletionRequest(prefix="def f(x):\n    ", suffix="\n", language="python")
    indent = typed_indent(request)
    assert indent is not None and indent.text == "    "
    assert indent.prompt_request(request).prefix == "def f(x):\n"
    assert indent.split(generated) == expected


def test_typed_indent_only_after_indentation() -> None:
    for prefix in ("x = 1\n", "def f(x):\n    return", "x"):
        assert typed_indent(CompletionRequest(prefix=prefix, suffix="", language="python")) is None


def test_typed_indent_heals_text_logprobs_and_stop_rule() -> None:
    indent = TypedIndent("    ")
    healed = indent.heal(Generation("    return x", [-0.01, -0.5, -0.2]))
    assert healed.text == "return x"
    assert healed.token_logprobs == [-0.5, -0.2]  # the indentation's token is not judged

    def first_newline(text: str) -> int | None:
        cut = text.find("\n")
        return cut if cut >= 0 else None

    stop = indent.stop(first_newline)
    assert stop("    ") is None
    assert stop("    return x") is None
    assert stop("    return x\n    y") == len("    return x")


@pytest.mark.parametrize(
    ("at_line_break", "text"),
    [
        pytest.param(True, "return x", id="fixed"),
        pytest.param(False, "  return x", id="cut-indent"),
    ],
)
def test_engine_ends_the_prompt_at_the_line_break(at_line_break: bool, text: str) -> None:
    from completion import gate
    from completion.engine import Engine
    from completion.settings import CompletionSettings
    from tests.support.scripted_model import ScriptedModel

    # A model that, after a prompt ending in indentation, writes more indentation (as models
    # often do when the indent token is cut in two), and writes the line whole otherwise.
    model = ScriptedModel(rules={"def f(x):\n    ": "  return x", "def f(x):\n": "    return x"})
    settings = CompletionSettings(model="scripted", cache=False, prompt_at_line_break=at_line_break)
    always = gate.builtin_policy().with_floor(1.0)
    engine = Engine(settings, model, policy_source=lambda: always)
    request = CompletionRequest(prefix="def f(x):\n    ", suffix="\n", language="python")
    decision = engine.complete(request)
    assert decision.text == text
    assert model.prompts[-1].endswith(
        "def f(x):\n" + ("" if at_line_break else "    ") + ("<|fim_suffix|>\n<|fim_middle|>")
    )
    assert decision.features["leading_whitespace"] == (0.0 if at_line_break else 1.0)


def test_relevance_floor_leaves_out_loosely_related_snippets_only() -> None:
    from completion.context import ContextBudget, LineTokenCounter, assemble
    from completion.types import Snippet

    class Source:
        def snippets(self, request: CompletionRequest, deadline: float) -> list[Snippet]:
            return [
                Snippet("a.py", "def a(): pass", 0.81, "index"),
                Snippet("b.py", "def b(): pass", 0.42, "index"),
                Snippet("c.py", "def c(): pass", 1.0, "definition"),
                Snippet("d.py", "def d(): pass", 0.1, "recent"),
            ]

    request = CompletionRequest(prefix="x = ", suffix="\n", language="python")
    counter = LineTokenCounter(len)
    for floor, kept in ((0.0, ["a.py", "b.py", "c.py", "d.py"]), (0.5, ["a.py", "c.py", "d.py"])):
        parts = assemble(
            request,
            ContextBudget(4000),
            count_tokens=counter,
            source=Source(),
            min_similarity=floor,
        )
        assert [s.path for s in parts.snippets] == kept


def test_snippets_in_the_slack_stay_while_the_user_types_on_the_line() -> None:
    small = [Snippet(f"m{i}.py", f"def f{i}(x):\n    return x\n", 0.9) for i in range(100)]
    counter = LineTokenCounter(words)
    budget = ContextBudget(1000, 0.8, 0.2, 0.0)
    chosen = []
    for typed in ("x", "x = f", "x = f ( a , b", "x = f ( a , b , c , d , e )"):
        request = CompletionRequest(
            prefix=numbered(410) + typed, suffix=numbered(50, 410), language="python"
        )
        parts = assemble(request, budget, count_tokens=counter, source=FixedSource(small))
        assert parts.prefix.endswith(typed)
        chosen.append(parts.snippets)
    assert chosen[0] and all(snippets == chosen[0] for snippets in chosen)
