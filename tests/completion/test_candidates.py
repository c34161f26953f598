"""Several candidates for an explicit request, also where typing has cached one suggestion."""

from __future__ import annotations

from dataclasses import dataclass, field

from completion.engine import Engine
from completion.gate import builtin_policy
from completion.settings import CompletionSettings
from completion.types import CancelToken, CompletionRequest, Generation, StopRule, TriggerKind
from tests.support.scripted_model import ScriptedModel

PREFIX = "def area(width, height):\n    return "
SUFFIX = "\n\nprint(area(2, 3))\n"
CANDIDATES = ["width * height", "height * width", "abs(width * height)"]


@dataclass
class CandidateModel(ScriptedModel):
    """A scripted model that also answers `generate_candidates`, with `CANDIDATES`."""

    candidate_calls: list[int] = field(default_factory=list)

    def generate_candidates(
        self,
        prompt: str,
        *,
        count: int,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
    ) -> list[Generation]:
        self.candidate_calls.append(count)
        first = self.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel)
        rest = [
            Generation(text=text, prompt_tokens=first.prompt_tokens, new_tokens=1)
            for text in CANDIDATES[1:count]
        ]
        return [first, *rest]


def request(trigger: TriggerKind, typed: str = "") -> CompletionRequest:
    return CompletionRequest(
        prefix=PREFIX + typed, suffix=SUFFIX, language="python", trigger=trigger
    )


def engine() -> tuple[Engine, CandidateModel]:
    model = CandidateModel(rules={"    return ": CANDIDATES[0]})
    policy = builtin_policy()
    return Engine(CompletionSettings(), model, policy_source=lambda: policy, seed=0), model


def texts(decision_text: str, alternatives: list[str]) -> list[str]:
    return [decision_text, *alternatives]


def test_an_explicit_request_gets_the_candidates() -> None:
    found, model = engine()
    decision = found.complete(request("invoked"))
    assert texts(decision.text, [a.text for a in decision.alternatives]) == CANDIDATES
    assert model.candidate_calls == [3]


def test_an_explicit_request_where_typing_cached_a_suggestion_still_gets_the_candidates() -> None:
    found, model = engine()
    typed = found.complete(request("automatic"))
    assert typed.text == CANDIDATES[0] and not typed.alternatives
    assert model.candidate_calls == []  # typing asks for one
    again = found.complete(request("invoked"))
    assert not again.cache_hit
    assert texts(again.text, [a.text for a in again.alternatives]) == CANDIDATES
    # Typing on through the suggestion is still served from the cache.
    through = found.complete(request("automatic", typed="wid"))
    assert through.cache_hit and through.text == "th * height"
