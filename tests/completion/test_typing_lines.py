"""While typing, a suggestion is one line (`completion.typingMaxLines`); an explicit request gets
a block; after a line is accepted, the prefetch has the next one."""

from __future__ import annotations

from completion.engine import Engine
from completion.gate import builtin_policy
from completion.settings import CompletionSettings
from completion.types import CompletionRequest, TriggerKind
from tests.support.scripted_model import ScriptedModel

PREFIX = "def mean(values):\n    total = sum(values)"
SUFFIX = "\n\n\nprint(mean([1, 2]))\n"
REST = ["\n    count = len(values)", "\n    return total / count"]


def engine(**settings: object) -> tuple[Engine, ScriptedModel]:
    model = ScriptedModel(
        rules={
            "total = sum(values)": "".join(REST) + "\n",
            "count = len(values)": REST[1] + "\n",
        }
    )
    policy = builtin_policy()
    return (
        Engine(CompletionSettings(**settings), model, policy_source=lambda: policy, seed=0),
        model,
    )


def request(trigger: TriggerKind) -> CompletionRequest:
    return CompletionRequest(prefix=PREFIX, suffix=SUFFIX, language="python", trigger=trigger)


def test_typing_gets_one_line_and_an_explicit_request_the_block() -> None:
    typing, _ = engine()
    assert typing.complete(request("automatic")).text == REST[0]
    explicit, _ = engine(candidates=1)
    assert explicit.complete(request("invoked")).text == "".join(REST)


def test_more_lines_while_typing_when_asked() -> None:
    two, _ = engine(typing_max_lines=2)
    assert two.complete(request("automatic")).text == "".join(REST)


def test_after_a_line_is_accepted_the_next_line_comes_from_the_prefetch() -> None:
    typing, model = engine()
    shown = request("automatic")
    decision = typing.complete(shown)
    assert typing.prefetch(shown, decision.text)
    calls = len(model.prompts)
    after = typing.complete(shown.after_inserting(decision.text))
    assert after.text == REST[1]
    assert after.cache_source == "prefetch"
    assert len(model.prompts) == calls  # no model call after Tab
