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
from pathlib import Path

from completion import fim, gate, postprocess
from completion.cache import TypingThroughCache
from completion.context import ContextBudget, ContextSource, LineTokenCounter, assemble
from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings
from completion.types import (
    CancelToken,
    CompletionRequest,
    Decision,
    Generation,
    Timings,
)

log = logging.getLogger(__name__)

PolicySource = Callable[[], gate.Policy]


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
        self.template = fim.template_for(
            runner.family if settings.fim_template == "auto" else settings.fim_template
        )
        self.context_source = context_source
        self._builtin_policy = gate.builtin_policy()
        self.policy_source = policy_source or (lambda: self._builtin_policy)
        self.cache = TypingThroughCache(enabled=settings.cache)
        self.token_counter = LineTokenCounter(runner.count_tokens)
        self._rng = random.Random(seed)
        # One model call at a time: runners keep a KV cache that is not thread-safe.
        self._model_lock = threading.Lock()
        self.model_calls = 0
        self.prefill_tokens = 0  # prompt tokens computed (not served from the KV cache), all calls

    @classmethod
    def load(
        cls,
        settings: CompletionSettings,
        cache_dir: Path,
        **kwargs: object,
    ) -> Engine:
        """Load the configured model runner (slow: seconds to minutes) and build an engine."""
        from completion.runners import load_runner

        runner = load_runner(settings, cache_dir)
        return cls(settings, runner, **kwargs)  # type: ignore[arg-type]

    @property
    def model_id(self) -> str:
        return self.runner.model_id

    def complete(
        self,
        request: CompletionRequest,
        cancel: CancelToken | None = None,
        signals: gate.Signals | None = None,
    ) -> Decision:
        """A suggestion for `request` and whether to show it.

        Raises `Cancelled` when `cancel` is set before the answer is ready.
        """
        cancel = cancel or CancelToken()
        signals = signals or gate.Signals()
        started = time.perf_counter()
        timings = Timings()

        cached = self.cache.lookup(request)
        generation: Generation | None = None
        empty_reason = ""
        if cached is not None:
            text = cached
            signals = gate.Signals(**{**signals.__dict__, "cache_hit": True})
        else:
            context_started = time.perf_counter()
            budget = ContextBudget.from_settings(self.settings)
            prompt_parts = assemble(
                request,
                budget,
                count_tokens=self.token_counter,
                source=self.context_source,
                deadline_s=self.settings.context_timeout_ms / 1000,
            )
            prompt = self.template.build(
                prompt_parts.prefix, prompt_parts.suffix, prompt_parts.snippets, request.path
            )
            timings.context_ms = (time.perf_counter() - context_started) * 1000
            signals = gate.Signals(
                **{
                    **signals.__dict__,
                    "retrieval_found": bool(prompt_parts.snippets),
                    "retrieval_similarity": max(
                        (s.score for s in prompt_parts.snippets), default=0.0
                    ),
                }
            )
            cancel.raise_if_cancelled()
            model_started = time.perf_counter()
            with self._model_lock:
                cancel.raise_if_cancelled()
                generation = self.runner.generate(
                    prompt,
                    max_new_tokens=self.settings.max_new_tokens,
                    stop=postprocess.stop_rule(request),
                    cancel=cancel,
                    temperature=self.settings.temperature,
                )
                self.model_calls += 1
                self.prefill_tokens += generation.prompt_tokens - generation.reused_tokens
            timings.model_ms = (time.perf_counter() - model_started) * 1000
            cancel.raise_if_cancelled()
            text, empty_reason = postprocess.clean_with_reason(
                generation.text, request, self.settings.min_chars
            )
            if text:
                self.cache.store(request, text)

        features = gate.extract_features(request, text, generation, signals)
        policy = self.policy_source()
        if text:
            action, propensity = policy.decide(features, self._rng)
        else:
            action, propensity = "silence", 1.0
        timings.total_ms = (time.perf_counter() - started) * 1000
        return Decision(
            decision_id=Decision.new_id(),
            action=action,
            text=text,
            propensity=propensity,
            policy_version=policy.version,
            model_id=self.model_id,
            features=features,
            timings=timings,
            cache_hit=cached is not None,
            reason=empty_reason if not text else action,
            generation=generation,
        )

    def close(self) -> None:
        self.runner.close()
