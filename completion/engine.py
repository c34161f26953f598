"""The completion engine: request in, decision out.

`Engine.complete` is synchronous and runs on a worker thread; it checks the request's
`CancelToken` between steps so a superseded request stops within one decode step.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from completion import fim, gate, postprocess
from completion.cache import TypingThroughCache
from completion.context import (
    ContextBudget,
    ContextSource,
    LineTokenCounter,
    NamedRepository,
    TypedTail,
    assemble,
    typed_tail,
)
from completion.latency import LatencyModel
from completion.runners.base import ModelRunner, RunnerCapabilities
from completion.settings import CompletionSettings
from completion.syntax import SyntaxChecker
from completion.types import (
    LATENCY_SKIP,
    CancelToken,
    CompletionRequest,
    Decision,
    Generation,
    Timings,
    TooLate,
)

log = logging.getLogger(__name__)

PolicySource = Callable[[], gate.Policy]
# Characters per model token in source code, for estimates before a prompt is tokenised.
CHARS_PER_TOKEN = 3


class Engine:
    """Assembles the prompt, runs the model, cleans its output and lets the policy decide."""

    def __init__(
        self,
        settings: CompletionSettings,
        runner: ModelRunner,
        *,
        context_source: ContextSource | None = None,
        policy_source: PolicySource | None = None,
        seed: int | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner
        # What the runner offers beyond the base protocol, checked once here.
        self.capabilities = RunnerCapabilities.of(runner)
        self.template = fim.template_for(
            runner.family if settings.fim_template == "auto" else settings.fim_template
        )
        self.context_source = context_source
        self._builtin_policy = gate.builtin_policy()
        self.policy_source = policy_source or (lambda: self._builtin_policy)
        self.cache = TypingThroughCache(enabled=settings.cache)
        self.token_counter = LineTokenCounter(runner.count_tokens)
        self.syntax = SyntaxChecker()
        self._rng = random.Random(seed)
        # One model call at a time: runners keep a KV cache that is not thread-safe.
        self._model_lock = threading.Lock()
        self.latency = LatencyModel()
        self.model_calls = 0
        self.prefill_tokens = 0  # prompt tokens computed (not served from the KV cache), all calls
        self.prefetched = 0  # prefetches that cached a suggestion
        self.latency_skips = 0
        # While the model runs: when the call started and its predicted time to first token.
        self._busy: tuple[float, float | None] | None = None
        self._last_uri = ""  # the document of the last model call

    @property
    def model_id(self) -> str:
        return self.runner.model_id

    def complete(
        self,
        request: CompletionRequest,
        cancel: CancelToken | None = None,
        signals: gate.Signals | None = None,
        *,
        pause_ms: float | None = None,
        defer_late: bool = False,
    ) -> Decision:
        """A suggestion for `request` and whether to show it.

        `pause_ms` is how long the user will probably pause after this edit (None: unknown); with
        `latency_skip` on, an automatic request whose first token cannot come sooner is answered
        silent at once, or, with `defer_late`, `TooLate` is raised once the prompt shows it (the
        language server then waits for the pause to turn out longer and asks again). An explicit
        request (`invoked`) gets up to `candidates` suggestions. Raises `Cancelled` when `cancel`
        is set before the answer is ready.
        """
        cancel = cancel or CancelToken()
        signals = signals or gate.Signals()
        started = time.perf_counter()
        timings = Timings()

        wanted = self._wanted(request)
        # The cache holds one suggestion: a request for several candidates (the user cycling
        # after typing at the same cursor) asks the model.
        hit = self.cache.find(request) if wanted == 1 else None
        generations: list[Generation | None] = [None]
        texts: list[str] = []
        empty_reason = ""
        syntax = "unchecked"
        if hit is not None:
            texts = [hit.text]
            generations = [hit.generation]
            signals = gate.Signals(**{**signals.__dict__, "cache_hit": True})
            model_version = hit.model_version
        else:
            prompt, signals = self._prompt(request, signals, timings)
            late = self.late_by(request, pause_ms, prompt, timings.context_ms)
            if late is not None:
                if defer_late:
                    raise TooLate(late)
                timings.total_ms = (time.perf_counter() - started) * 1000
                return self._skipped(timings, late, pause_ms)
            found = self._run_model(request, prompt, cancel, timings, wanted)
            generations = list(found)
            model_version = found[0].model_version
            for index, generation in enumerate(found):
                text, reason = postprocess.clean_with_reason(
                    generation.text, request, self.settings.min_chars
                )
                checked, outcome = self.check_syntax(
                    request, text, timings if index == 0 else Timings()
                )
                if index == 0:
                    syntax = outcome
                    empty_reason = postprocess.SYNTAX_DROPPED if outcome == "dropped" else reason
                texts.append(checked)
            if texts[0]:
                self.cache.store(request, texts[0], model_version=model_version)

        policy = self.policy_source()
        features = gate.extract_features(request, texts[0], generations[0], signals, syntax=syntax)
        if texts[0]:
            action, propensity = policy.decide(features, self._rng)
        else:
            action, propensity = "silence", 1.0
        timings.total_ms = (time.perf_counter() - started) * 1000
        decision = Decision(
            decision_id=Decision.new_id(),
            action=action,
            text=texts[0],
            propensity=propensity,
            policy_version=policy.version,
            model_id=self.model_id,
            features=features,
            timings=timings,
            cache_hit=hit is not None,
            cache_source=hit.source if hit is not None else "",
            reason=empty_reason if not texts[0] else action,
            generation=generations[0],
            syntax=syntax,
            model_version=model_version,
        )
        if texts[0]:
            decision.alternatives = self._alternatives(
                decision, request, texts, generations, signals
            )
        decision.request_id = decision.decision_id
        return decision

    def prefetch(
        self, request: CompletionRequest, suggestion: str, cancel: CancelToken | None = None
    ) -> bool:
        """Compute and cache the answer at the cursor that accepting `suggestion` leads to.

        Returns whether a suggestion was cached. Raises `Cancelled` when `cancel` is set first.
        """
        cancel = cancel or CancelToken()
        after = request.after_inserting(suggestion)
        if self.cache.find(after) is not None:
            return False
        prompt, _ = self._prompt(after, gate.Signals(), Timings())
        (generation,) = self._run_model(after, prompt, cancel, Timings(), 1)
        text = postprocess.clean(generation.text, after, self.settings.min_chars)
        text, _ = self.check_syntax(after, text, Timings())
        if not text:
            return False
        self.cache.store(after, text, source="prefetch", generation=generation)
        self.prefetched += 1
        return True

    # -- steps ---------------------------------------------------------------------------

    def _prompt(
        self, request: CompletionRequest, signals: gate.Signals, timings: Timings
    ) -> tuple[str, gate.Signals]:
        context_started = time.perf_counter()
        budget = ContextBudget.from_settings(self.settings)
        indent = self._typed_tail(request)
        prompt_parts = assemble(
            indent.prompt_request(request) if indent else request,
            budget,
            count_tokens=self.token_counter,
            source=self.context_source,
            deadline_s=self.settings.context_timeout_ms / 1000,
            min_similarity=self.settings.snippet_min_similarity,
            definition_heads=self.settings.snippet_definition_heads,
        )
        prompt = self.template.build(
            prompt_parts.prefix,
            prompt_parts.suffix,
            prompt_parts.snippets,
            request.path,
            source.repo_name if isinstance(source := self.context_source, NamedRepository) else "",
        )
        timings.context_ms = (time.perf_counter() - context_started) * 1000
        signals = gate.Signals(
            **{
                **signals.__dict__,
                "retrieval_found": bool(prompt_parts.snippets),
                "retrieval_similarity": max((s.score for s in prompt_parts.snippets), default=0.0),
            }
        )
        return prompt, signals

    def check_syntax(
        self, request: CompletionRequest, text: str, timings: Timings
    ) -> tuple[str, str]:
        """`text` after the syntax check in place (`completion.syntaxCheck`) and what it did."""
        if not self.settings.syntax_check or not text:
            return text, "unchecked"
        verdict = self.syntax.check(request, text)
        timings.syntax_ms = verdict.ms
        if verdict.outcome == "cut" and not postprocess.clean(
            verdict.text, request, self.settings.min_chars
        ):
            return "", "dropped"  # what is left is not worth showing
        return verdict.text, verdict.outcome

    def _typed_tail(self, request: CompletionRequest) -> TypedTail | None:
        """Typed text left out of the prompt: indentation (`completion.promptAtLineBreak`) or a
        partial token the runner must write again (`completion.tokenHealing`)."""
        return typed_tail(
            request,
            indentation=self.settings.prompt_at_line_break,
            partial_tokens=self.settings.token_healing and self.capabilities.healing is not None,
        )

    def _wanted(self, request: CompletionRequest) -> int:
        """How many candidates to compute: several only when the user asked explicitly."""
        if request.trigger != "invoked" or self.capabilities.candidates is None:
            return 1
        return self.settings.candidates

    def _max_lines(self, request: CompletionRequest) -> int:
        """Most lines of the suggestion: one at a time while typing (`typingMaxLines`)."""
        if request.trigger == "automatic":
            return self.settings.typing_max_lines
        return postprocess.DEFAULT_MAX_LINES

    def _run_model(
        self,
        request: CompletionRequest,
        prompt: str,
        cancel: CancelToken,
        timings: Timings,
        count: int,
    ) -> list[Generation]:
        cancel.raise_if_cancelled()
        model_started = time.perf_counter()
        stop = postprocess.stop_rule(request, max_lines=self._max_lines(request))
        indent = self._typed_tail(request)
        healing = None
        if indent is not None:
            stop = indent.stop(stop)
            if indent.forced:  # asked for only of a runner that heals (`_typed_tail`)
                healing = self.capabilities.healing
                count = 1  # the candidates' different first tokens would not fit the constraint
        candidates = self.capabilities.candidates if count > 1 else None
        with self._model_lock:
            cancel.raise_if_cancelled()
            self._busy = (time.perf_counter(), self.latency.predict(self._to_read(prompt)))
            generations: list[Generation]
            if candidates is not None:
                generations = candidates.generate_candidates(
                    prompt,
                    count=count,
                    max_new_tokens=self.settings.max_new_tokens,
                    stop=stop,
                    cancel=cancel,
                )
            elif healing is not None and indent is not None:
                generations = [
                    healing.generate(
                        prompt,
                        max_new_tokens=self.settings.max_new_tokens,
                        stop=stop,
                        cancel=cancel,
                        temperature=self.settings.temperature,
                        forced_text=indent.text,
                        unfinished_word=indent.unfinished_word,
                    )
                ]
            else:
                generations = [
                    self.runner.generate(
                        prompt,
                        max_new_tokens=self.settings.max_new_tokens,
                        stop=stop,
                        cancel=cancel,
                        temperature=self.settings.temperature,
                    )
                ]
            if indent is not None:
                generations = [indent.heal(generation) for generation in generations]
            self.model_calls += 1
            first = generations[0]
            read = first.prompt_tokens - first.reused_tokens
            self.prefill_tokens += read
            # A call cancelled after its prompt was read still tells how long reading took.
            if first.prefill_done or (first.stop_reason != "cancelled" and first.new_tokens):
                self.latency.observe(read, first.prefill_ms)
            self._busy = None
            self._last_uri = request.uri
        timings.model_ms = (time.perf_counter() - model_started) * 1000
        cancel.raise_if_cancelled()
        return generations

    def skip_early(self, request: CompletionRequest, pause_ms: float | None) -> Decision | None:
        """The latency silence for `request` before it waits for the model thread, or None.

        Called on the event loop as the request arrives (`late_by` without a prompt); a
        silence is counted and recorded.
        """
        late = self.late_by(request, pause_ms)
        return None if late is None else self._skipped(Timings(), late, pause_ms)

    def late_by(
        self,
        request: CompletionRequest,
        pause_ms: float | None,
        prompt: str | None = None,
        context_ms: float = 0.0,
    ) -> float | None:
        """The latency decision: the predicted milliseconds to the first token for `request` when
        they exceed the pause the user will probably leave (`pause_ms`; None: unknown, never too
        late), else None.

        Only automatic requests are judged, and only with `latency_skip` on. Before the prompt
        is built (`prompt` None, on the event loop as the request arrives) a request that would
        first wait for the call now running (a cancelled request's prompt cannot be interrupted
        in the fast engine) and then read its own prompt is too late when that sum exceeds the
        pause; the prompt's size is estimated from the text around the cursor, bounded by
        `context_tokens`, and an answer from the typing cache is never late. With the prompt (on
        the model thread), the time the context took plus the prompt tokens the runner will read
        decide. Counts and records nothing.
        """
        if not self.settings.latency_skip or request.trigger != "automatic" or pause_ms is None:
            return None
        predicted = self.predicted_ms(request, prompt, context_ms)
        return predicted if predicted is not None and predicted > pause_ms else None

    def predicted_ms(
        self, request: CompletionRequest, prompt: str | None = None, context_ms: float = 0.0
    ) -> float | None:
        """Milliseconds to the first token of `request` as `late_by` predicts them (None
        before the engine has timed enough calls; 0 for an answer from the typing cache)."""
        if prompt is not None:
            return self.latency.predict(self._to_read(prompt), context_ms)
        if self.cache.enabled and self.cache.find(request) is not None:
            return 0.0  # answered from the cache, without the model
        chars = len(request.prefix) + len(request.suffix)
        estimate = min(self.settings.context_tokens, chars // CHARS_PER_TOKEN + 1)
        reuse = self.capabilities.prompt_reuse
        if reuse is not None and request.uri and request.uri == self._last_uri:
            # Typing on in the same document: the runner probably still holds the prompt's
            # start (`tokens_to_read`); only the cursor's lines and the suffix are read again.
            estimate = max(estimate - reuse.kept_tokens, 1)
        own = self.latency.predict(estimate)
        if own is None:
            return None
        waiting = 0.0
        busy = self._busy
        if busy is not None and busy[1] is not None:
            waiting = max(0.0, busy[1] - (time.perf_counter() - busy[0]) * 1000)
        return waiting + own

    def _to_read(self, prompt: str) -> int:
        """Prompt tokens the runner will compute for `prompt` (less what it keeps from before)."""
        prefill = self.capabilities.prefill
        if prefill is not None:
            return prefill.tokens_to_read(prompt)
        return self.runner.count_tokens(prompt)

    def _skipped(self, timings: Timings, predicted_ms: float, pause_ms: float | None) -> Decision:
        self.latency_skips += 1
        timings.predicted_ms = predicted_ms
        timings.likely_pause_ms = pause_ms or 0.0
        policy = self.policy_source()
        decision = Decision(
            decision_id=Decision.new_id(),
            action="silence",
            propensity=1.0,
            policy_version=policy.version,
            model_id=self.model_id,
            timings=timings,
            reason=LATENCY_SKIP,
        )
        decision.request_id = decision.decision_id
        return decision

    def _alternatives(
        self,
        first: Decision,
        request: CompletionRequest,
        texts: list[str],
        generations: list[Generation | None],
        signals: gate.Signals,
    ) -> list[Decision]:
        """The other candidates, distinct and non-empty, sharing the request's action."""
        seen = {first.text}
        found: list[Decision] = []
        for text, generation in zip(texts[1:], generations[1:], strict=True):
            if not text or text in seen:
                continue
            seen.add(text)
            found.append(
                Decision(
                    decision_id=Decision.new_id(),
                    action=first.action,
                    text=text,
                    propensity=first.propensity,
                    policy_version=first.policy_version,
                    model_id=first.model_id,
                    features=gate.extract_features(request, text, generation, signals),
                    timings=first.timings,
                    reason=first.reason,
                    generation=generation,
                    model_version=first.model_version,
                    rank=len(found) + 1,
                    request_id=first.decision_id,
                )
            )
        return found

    def close(self) -> None:
        self.runner.close()
