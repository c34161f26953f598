"""Token healing: where the prompt backs off, which tokens may come first, and the engine's use.

Engine tests use a scripted model that follows the constraint by choosing, among the
continuations it prefers for a prompt, the first that spells the forced text: what any runner
that honours `forced_text` does. The real runners are checked on the committed tiny model for the
properties any output must have (it starts with the forced text; forcing text the model writes
anyway changes nothing), never for what the model writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from completion import gate
from completion.context import TypedTail, typed_tail
from completion.engine import Engine
from completion.healing import VocabIndex, best_allowed, token_texts
from completion.settings import CompletionSettings
from completion.types import CancelToken, CompletionRequest, Generation, StopRule
from tests.support.scripted_model import code_before_cursor, split_tokens

VOCAB = ["i", "is", " is", " isinstance", " isin", "inst", "ance", " ", ".", ".path", ".pa", "<"]


def request(prefix: str, suffix: str = "\n") -> CompletionRequest:
    return CompletionRequest(prefix=prefix, suffix=suffix, language="python", path="m.py")


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        pytest.param("def f(x):\n    if isinst", " isinst", id="identifier-after-space"),
        pytest.param("import os\np = os.pa", ".pa", id="dotted-name"),
        pytest.param("p = os.", ".", id="after-a-dot"),
        pytest.param("    return a <", " <", id="operator"),
        pytest.param("    x +=", " +=", id="two-char-operator"),
        pytest.param("print(len", "(len", id="after-a-bracket"),
        pytest.param("def f():\n    retu", "    retu", id="word-after-indentation"),
        pytest.param("x = foo_bar2", " foo_bar2", id="underscores-and-digits"),
        pytest.param("    x = 1 ", None, id="after-a-space"),
        pytest.param("    x = f()", None, id="after-a-closing-bracket"),
        pytest.param("s = 'café", None, id="not-ascii"),
        pytest.param("x = " + "a" * 60, None, id="too-long"),
    ],
)
def test_where_the_prompt_backs_off(prefix: str, expected: str | None) -> None:
    tail = typed_tail(request(prefix), partial_tokens=True)
    if expected is None:
        assert tail is None
        return
    assert (tail.text, tail.forced) == (expected, True)
    assert tail.prompt_request(request(prefix)).prefix == prefix[: -len(expected)]


def test_indentation_alone_is_healed_as_before() -> None:
    tail = typed_tail(request("def f():\n    "), partial_tokens=True)
    assert tail == TypedTail("    ", forced=False)
    assert typed_tail(request("def f():\n    "), indentation=False, partial_tokens=True) is None


def test_partial_tokens_only_when_asked() -> None:
    assert typed_tail(request("if isinst")) is None
    # Without indentation healing, a word after indentation backs off to the word only.
    tail = typed_tail(request("    retu"), indentation=False, partial_tokens=True)
    assert tail == TypedTail("retu", forced=True, unfinished_word=True)


@pytest.mark.parametrize(
    ("prefix", "suffix", "language", "unfinished"),
    [
        pytest.param("if hasattr(socke", ", 'x'):\n", "python", True, id="a-word-never-used-whole"),
        pytest.param("import socket\nif hasattr(socke", "\n", "python", True, id="only-longer"),
        pytest.param("socke = 1\nif hasattr(socke", "\n", "python", False, id="used-before"),
        pytest.param("if hasattr(socke", "\nprint(socke)\n", "python", False, id="used-after"),
        pytest.param("def f():\n    return", "\n", "python", False, id="python-keyword"),
        pytest.param("x = len", "\n", "python", False, id="python-builtin"),
        pytest.param("x = len", "\n", "javascript", True, id="other-language"),
        pytest.param("x = 12", "\n", "python", False, id="a-number"),
        pytest.param("return a <", "\n", "python", False, id="an-operator"),
        pytest.param("p = os.pa", "\n", "python", True, id="dotted-name"),
    ],
)
def test_an_unfinished_word_must_go_on(
    prefix: str, suffix: str, language: str, unfinished: bool
) -> None:
    asked = CompletionRequest(prefix=prefix, suffix=suffix, language=language, path="m")
    tail = typed_tail(asked, partial_tokens=True)
    assert tail is not None and tail.forced
    assert tail.unfinished_word is unfinished


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        pytest.param(" isinstance(x, int)", ("ance(x, int)", 7), id="completes-the-word"),
        pytest.param(" isinst", ("", 7), id="exactly-the-typed-text"),
        pytest.param(" isi", None, id="still-spelling"),
        pytest.param(" foo", ("", 4), id="diverged"),
    ],
)
def test_forced_split(generated: str, expected: tuple[str, int] | None) -> None:
    assert TypedTail(" isinst", forced=True).split(generated) == expected


def test_forced_stop_and_heal() -> None:
    tail = TypedTail(" isinst", forced=True)

    def first_newline(text: str) -> int | None:
        cut = text.find("\n")
        return cut if cut >= 0 else None

    stop = tail.stop(first_newline)
    assert stop(" is") is None
    assert stop(" isinstance(x)") is None
    assert stop(" isinstance(x)\ny") == len(" isinstance(x)")
    assert stop(" if") == 0  # a runner that did not follow the constraint keeps nothing
    healed = tail.heal(Generation(" isinstance(x)", [-0.2, -0.1, -0.3]))
    assert healed.text == "ance(x)"
    assert healed.token_logprobs == [-0.2, -0.1, -0.3]  # the first token also completes the word


def test_vocab_index_allows_tokens_that_spell_or_finish_the_text() -> None:
    index = VocabIndex(VOCAB)
    words = {VOCAB[i] for i in index.allowed(" isinst")}
    assert words == {" ", " is", " isinstance", " isin"}
    assert {VOCAB[i] for i in index.allowed("inst")} == {"i", "inst"}
    assert {VOCAB[i] for i in index.allowed(".pa")} == {".", ".pa", ".path"}
    assert index.allowed("zz") == frozenset()


def test_vocab_index_for_an_unfinished_word_wants_a_word_character_after_it() -> None:
    index = VocabIndex(VOCAB)
    assert {VOCAB[i] for i in index.allowed(" is")} == {" ", " is", " isinstance", " isin"}
    # A token that ends where the typing ended would take the fragment for the whole word.
    assert {VOCAB[i] for i in index.allowed(" is", True)} == {" ", " isinstance", " isin"}
    assert {VOCAB[i] for i in index.allowed(".pa", True)} == {".", ".path"}
    index = VocabIndex(["ab", "ab(", "abc", "a"])
    assert {index.text(i) for i in index.allowed("ab", True)} == {"a", "abc"}


def test_vocab_index_leaves_out_excluded_and_partial_byte_tokens() -> None:
    index = VocabIndex([" is", " isinstance", "\ufffd", " i"], excluded=[1])
    assert {index.text(i) for i in index.allowed(" isinst")} == {" is", " i"}


def test_best_allowed_takes_the_likeliest_fitting_token_with_its_own_logprob() -> None:
    logits = np.array([5.0, 1.0, 3.0, 0.0])
    token, logprob = best_allowed(logits, {1, 2})
    assert token == 2
    expected = 3.0 - math.log(sum(math.exp(v) for v in logits))
    assert logprob == pytest.approx(expected)
    with pytest.raises(ValueError, match="no token"):
        best_allowed(logits, set())


def test_token_texts_restore_sentencepiece_spaces() -> None:
    assert token_texts(["is", "is", "("], ["\u2581is", "is", "("]) == [" is", "is", "("]


@dataclass
class PreferringModel:
    """A runner that, for the code before the cursor, prefers continuations in the order given,
    and under a constraint writes the first one that starts with the forced text."""

    preferences: dict[str, list[str]]
    forces_text: bool = True
    model_id: str = "preferring"
    family: str = "qwen"
    prompts: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)

    def count_tokens(self, text: str) -> int:
        return len(split_tokens(text))

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
        forced_text: str = "",
        unfinished_word: bool = False,
    ) -> Generation:
        self.prompts.append(prompt)
        self.forced.append(forced_text)
        before = code_before_cursor(prompt)
        options = next((v for k, v in self.preferences.items() if before.endswith(k)), [""])

        def fits(option: str) -> bool:
            after = option[len(forced_text) : len(forced_text) + 1]
            return option.startswith(forced_text) and (
                not unfinished_word or after.isalnum() or after == "_"
            )

        text = next((o for o in options if fits(o)), "")
        result = Generation(text="", stop_reason="eos")
        for token in split_tokens(text)[:max_new_tokens]:
            result.text += token
            result.token_logprobs.append(-0.1)
            cut = stop(result.text)
            if cut is not None:
                result.text = result.text[:cut]
                result.stop_reason = "stop"
                break
        return result

    def close(self) -> None:
        pass


PREFERENCES = {
    # At the typed fragment the model starts a new word, as the issue saw.
    "if isinst": [" instream is not None:"],
    # At the token boundary it prefers another condition, but can complete the word.
    "    if": [" x is None:", " isinstance(x, int):"],
    "os.pa": ["th.join(a, b)"],
    "= os": [".getcwd()", ".path.join(a, b)"],
    "return a <": [" b + 1"],
    "return a": [" + b", " <= b"],
    # It would take the typed fragment for the whole name unless made to go on.
    "if hasattr": ["(socke, 'x'):", "(socket, 'AF_UNIX'):"],
}


def engine_for(model: PreferringModel, **settings: object) -> Engine:
    always = gate.builtin_policy().with_floor(1.0)
    chosen = CompletionSettings(model="scripted", cache=False, **settings)
    return Engine(chosen, model, policy_source=lambda: always)


@pytest.mark.parametrize(
    ("prefix", "healing", "text", "prompt_end", "forced"),
    [
        pytest.param(
            "def f(x):\n    if isinst", True, "ance(x, int):", "    if", " isinst", id="identifier"
        ),
        pytest.param(
            "def f(x):\n    if isinst",
            False,
            " instream is not None:",
            "if isinst",
            "",
            id="identifier-unhealed",
        ),
        pytest.param("p = os.pa", True, "th.join(a, b)", "p = os", ".pa", id="dotted-name"),
        pytest.param("def f(a, b):\n    return a <", True, "= b", "return a", " <", id="operator"),
        pytest.param(
            "def f(a, b):\n    return a <",
            False,
            " b + 1",
            "return a <",
            "",
            id="operator-unhealed",
        ),
    ],
)
def test_engine_heals_partial_tokens(
    prefix: str, healing: bool, text: str, prompt_end: str, forced: str
) -> None:
    model = PreferringModel(PREFERENCES)
    engine = engine_for(model, token_healing=healing, syntax_check=False)
    decision = engine.complete(request(prefix, "\n"))
    assert decision.text == text
    assert code_before_cursor(model.prompts[-1]).endswith(prompt_end)
    assert model.forced[-1] == forced


@pytest.mark.parametrize(
    ("before", "text"),
    [
        pytest.param("", "t, 'AF_UNIX'):", id="unfinished"),
        pytest.param("socke = None\n", ", 'x'):", id="a-name-the-file-uses"),
    ],
)
def test_engine_completes_an_unfinished_word(before: str, text: str) -> None:
    model = PreferringModel(PREFERENCES)
    engine = engine_for(model, token_healing=True, syntax_check=False)
    decision = engine.complete(request(before + "def f(x):\n    if hasattr(socke", "\n"))
    assert decision.text == text
    assert model.forced[-1] == "(socke"


def test_engine_does_not_force_a_runner_that_cannot() -> None:
    model = PreferringModel(PREFERENCES, forces_text=False)
    engine = engine_for(model, token_healing=True, syntax_check=False)
    decision = engine.complete(request("def f(x):\n    if isinst", "\n"))
    assert decision.text == " instream is not None:"
    assert model.forced == [""]


# -- the real runners, on the committed tiny model ----------------------------------------------

PROMPT = "<|fim_prefix|>def add(a, b):\n    return<|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"


def never(_text: str) -> int | None:
    return None


@pytest.fixture(scope="module", params=["ctranslate2", "torch"])
def runner(
    request: pytest.FixtureRequest,
    tiny_model_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[object]:
    if request.param == "ctranslate2":
        from completion.runners.ct2 import Ct2Runner

        loaded: object = Ct2Runner(
            str(tiny_model_path), tmp_path_factory.mktemp("heal-ct2"), threads=1
        )
    else:
        from completion.runners.torch_runner import TorchRunner

        loaded = TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("heal-torch"), threads=1)
    yield loaded
    loaded.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("forced", [" a", " a +", "zq_zq.zq", " <="])
def test_runner_output_starts_with_the_forced_text(runner: object, forced: str) -> None:
    generation = runner.generate(  # type: ignore[attr-defined]
        PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken(), forced_text=forced
    )
    assert generation.text.startswith(forced) or (
        generation.stop_reason == "length" and forced.startswith(generation.text)
    )
    assert len(generation.token_logprobs) == generation.new_tokens
    assert all(lp <= 0.0 for lp in generation.token_logprobs)


@pytest.mark.parametrize("forced", [" a", "(zq_zq", " retu"])
def test_runner_goes_on_after_an_unfinished_word(runner: object, forced: str) -> None:
    generation = runner.generate(  # type: ignore[attr-defined]
        PROMPT,
        max_new_tokens=12,
        stop=never,
        cancel=CancelToken(),
        forced_text=forced,
        unfinished_word=True,
    )
    assert generation.text.startswith(forced), generation
    after = generation.text[len(forced)]
    assert after.isalnum() or after == "_", generation.text


def test_forcing_what_the_model_writes_anyway_changes_nothing(runner: object) -> None:
    plain = runner.generate(  # type: ignore[attr-defined]
        PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken()
    )
    # The committed tiny model writes text here (its greedy margins are well above rounding);
    # whitespace is fine to force too.
    assert plain.text, plain
    # Forcing the text of the model's own first token(s) keeps its greedy choices.
    forced = plain.text[: max(1, min(3, len(plain.text)))]
    healed = runner.generate(  # type: ignore[attr-defined]
        PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken(), forced_text=forced
    )
    assert healed.text == plain.text
    assert getattr(healed, "forced_rereads", 0) == 0
