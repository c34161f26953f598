"""The fast local runner: the same model in CTranslate2, int8 weights, decoded in C++.

On a small CPU this is about three times faster than torch float32 for the bundled model, at a
quarter of the memory (`tabloop bench engines`, docs/models.md). It keeps what the editor needs:
a callback after every token applies the stop rule to the decoded text, records the token's
log-probability for the gate and checks for cancellation, so a superseded request stops within one
token once its prompt is read. The prompt is read in one pass of the engine (it offers no way to
interrupt it): `completion.contextTokens` bounds how long that takes.

Across keystrokes the runner keeps the model state of the prompt's unchanged start in the
engine's static-prompt cache, one at a time (`completion/runners/static_prompt.py`), so typing on
a line reads only the cursor's lines and the suffix again.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from completion.fim import template_for
from completion.healing import VocabIndex, best_allowed
from completion.runners.base import PreparedModel
from completion.runners.conversion import (
    ComputeType,
    checksum,
    clear_failure,
    ensure_converted,
)
from completion.runners.conversion import Progress as ConversionProgress
from completion.runners.converted import ConvertedRunner
from completion.runners.loading import resolve_source
from completion.runners.static_prompt import StaticPrompt
from completion.runners.tokens import TokenStream, family_of, stop_ids
from completion.types import CancelToken, Generation, StopRule

log = logging.getLogger(__name__)


def default_threads() -> int:
    """Engine threads when the user sets none: every core (the engine waits well on two)."""
    return max(1, os.cpu_count() or 1)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _release_free_memory() -> None:
    """Hand freed heap memory back to the system (glibc; elsewhere nothing to do)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass(frozen=True)
class _Split:
    """How one request reads its prompt: its first `end` tokens as the engine's static prompt
    (0: the whole prompt at once), `reused` of them from the kept state, and the options that say
    so. Decided once per request (`Ct2Runner._split`); a second reading within the request (a
    healing reread, the candidates' batch) uses `again()`."""

    end: int = 0
    reused: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def again(self) -> _Split:
        """The same request reading its prompt once more: a part it kept is in the cache now."""
        kept = bool(self.options.get("cache_static_prompt"))
        return replace(self, reused=self.end if kept else 0)


class Ct2Runner(ConvertedRunner):
    """A causal LM converted for CTranslate2, run in this process, one request at a time."""

    ENGINE = "ctranslate2"
    MODEL_TAG = "ct2"

    forces_text = True  # `generate(forced_text=...)`: token healing (`completion.healing`)

    def __init__(
        self,
        model: str,
        cache_dir: Path,
        *,
        compute_type: ComputeType = "int8",
        threads: int = 0,
        family: str | None = None,
        progress: ConversionProgress | None = None,
        reuse_prefix: bool = True,
    ) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        started = time.perf_counter()
        self.source = resolve_source(model, cache_dir)
        self.cache_dir = cache_dir
        self.compute_type = compute_type
        self.path = ensure_converted(self.source, compute_type, cache_dir, progress=progress)
        self.base_path = self.path
        self.threads = threads or default_threads()
        self.generator = self._load(self.path)
        clear_failure(model, compute_type, cache_dir)
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.engine_version = ctranslate2.__version__
        self.weights_sha256 = checksum(self.path) or ""
        # Adapter manifests name their base model so (`completion.adapters`).
        self.base_model_id = f"{self.source.name}@{self.source.revision}"
        self.adapter: Path | None = None
        # The int8 weights write other text than the original ones: decisions say which ran.
        self.model_id = self._model_id(None)
        self.family = family or family_of(self.tokenizer, self.source.name)
        self.stop_strings = template_for(self.family).stop_tokens
        self.stop_ids = frozenset(stop_ids(self.path, self.tokenizer, self.stop_strings))
        self._end_tokens = sorted(self.stop_ids)
        self._lock = threading.Lock()
        self._vocab: VocabIndex | None = None
        self._breaks: dict[int, bool] = {}
        marker = self.tokenizer.token_to_id(template_for(self.family).suffix_marker or "\0")
        self.reuse = StaticPrompt(marker, self._has_break) if reuse_prefix else None
        self.reset_ms = 0.0  # time spent emptying the engine's prompt cache
        _OPEN.add(self)
        self.load_s = time.perf_counter() - started
        log.info(
            "loaded %s in CTranslate2 %s (%s, %d threads) in %.1fs",
            self.model_id,
            self.engine_version,
            compute_type,
            self.threads,
            self.load_s,
        )

    def _load(self, path: Path) -> Any:
        import ctranslate2

        return ctranslate2.Generator(
            str(path),
            device="cpu",
            compute_type=self.compute_type,
            intra_threads=self.threads,
            inter_threads=1,
        )

    def install(self, prepared: PreparedModel) -> None:
        """Serve `prepared` from the next request on; a request in progress finishes first."""
        with self._lock:
            if self.generator is None:
                raise RuntimeError("the runner is closed")
            old = self.generator
            self.generator = prepared.generator
            if self.reuse is not None:
                self.reuse.forget()  # the kept state belongs to the old weights
            self.path = prepared.path
            self.adapter = prepared.adapter
            self.model_id = prepared.model_id
            self.weights_sha256 = prepared.weights_sha256
        del old  # released outside the lock
        log.info("now serving %s", self.model_id)

    def describe(self) -> dict[str, Any]:
        """What `tabloop doctor` reports about the engine."""
        return {
            "engine": "ctranslate2",
            "engine_version": self.engine_version,
            "compute_type": self.compute_type,
            "threads": self.threads,
            "converted_model": str(self.path),
            "converted_sha256": self.weights_sha256,
            "adapter": str(self.adapter) if self.adapter else None,
        }

    def tokens_to_read(self, prompt: str) -> int:
        """Prompt tokens the engine would compute for `prompt` now: those after the static part
        it keeps, when `prompt` starts with it (`completion.cache`), else all of them."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        if self.reuse is not None and self.reuse.kept is not None:
            end = self.reuse.split(ids)
            if end and tuple(ids[:end]) == self.reuse.kept:
                return len(ids) - end
        return len(ids)

    @property
    def output_variant(self) -> str:
        """How this runner reads prompts, where that changes the text it writes: split prompts
        round differently from whole ones (`completion.output_cache` keys outputs by it)."""
        return self.reuse.variant if self.reuse is not None else ""

    @property
    def kept_tokens(self) -> int:
        """Length of the static part whose state the engine keeps (0: none)."""
        kept = self.reuse.kept if self.reuse is not None else None
        return len(kept) if kept else 0

    def _has_break(self, token: int) -> bool:
        found = self._breaks.get(token)
        if found is None:
            found = self._breaks[token] = "\n" in self.tokenizer.decode([token])
        return found

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or "" for i in ids]

    def _split(self, ids: list[int], cancel: CancelToken) -> _Split:
        """How a request reads the prompt `ids` (`StaticPrompt`); may empty the engine's cache.
        A request already cancelled reads nothing and decides nothing."""
        if self.reuse is None or cancel.cancelled:
            return _Split()
        end = self.reuse.split(ids)
        if not end:
            return _Split()
        action = self.reuse.decide(ids[:end])
        if action == "reset" and not self._empty_state_cache():
            action = "once"
        keep = action != "once"
        if action in ("keep", "reset"):
            self.reuse.kept_now(ids[:end], reset=action == "reset")
        options = {"static_prompt": self._pieces(ids[:end]), "cache_static_prompt": keep}
        return _Split(end, end if action == "hit" else 0, options)

    def _empty_state_cache(self) -> bool:
        """Let go of every kept static-prompt state; False when the engine would not.

        CTranslate2 never evicts one: unloading and loading the model again (about 0.3 s for the
        bundled model, its file in the page cache) starts an empty cache, and the freed memory
        goes back to the system. The engine refuses to unload while it still counts a batch as
        running, which can last a moment after the previous call returned.
        """
        started = time.perf_counter()
        for _ in range(40):
            self.generator.unload_model()
            if not self.generator.model_is_loaded:
                break
            time.sleep(0.005)
        else:
            log.warning("the engine kept its model loaded; its prompt cache stays as it is")
            return False
        try:
            self.generator.load_model()
        except Exception:  # the files changed under a running server: load them afresh
            log.exception("reloading the model failed; loading %s again", self.path)
            self.generator = self._load(self.path)
        _release_free_memory()
        self.reset_ms += _ms(started)
        log.debug("emptied the static-prompt cache in %.0f ms", _ms(started))
        return True

    def _options(self, max_new_tokens: int, temperature: float) -> dict[str, Any]:
        sampling: dict[str, Any] = {"sampling_topk": 1}
        if temperature > 0:
            sampling = {"sampling_topk": 0, "sampling_temperature": temperature}
        return {
            "max_length": max_new_tokens,
            "include_prompt_in_result": False,
            "return_scores": True,
            "end_token": self._end_tokens,
            **sampling,
        }

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
        """Continue `prompt` until `stop` cuts, EOS, `max_new_tokens`, or cancellation.

        With `forced_text`, the output starts with exactly that text (`_run_forced`); with
        `unfinished_word` too, a word character follows it (`VocabIndex.allowed`).
        """
        with self._lock:
            encoding = self.tokenizer.encode(prompt, add_special_tokens=False)
            if forced_text:
                return self._run_forced(
                    encoding.ids,
                    max_new_tokens,
                    stop,
                    cancel,
                    temperature,
                    forced_text,
                    unfinished_word,
                )
            split = self._split(encoding.ids, cancel)
            return self._run([encoding.ids], max_new_tokens, stop, cancel, temperature, split)[0]

    def _run_forced(
        self,
        ids: list[int],
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float,
        forced: str,
        unfinished_word: bool = False,
    ) -> Generation:
        """Generate text that starts with `forced` (token healing).

        CTranslate2 offers no hook that changes a step's token (its callback can only stop the
        generation, and `suppress_sequences` holds for every step). So the generation runs as
        usual while every step's token is checked against the typed text; when the model's own
        token does not fit, the generation stops there, the most likely token that fits is taken
        from that step's scores, and the prompt is read again with the tokens so far. When the
        model's first choice already spells the typed text (the usual case), that costs nothing;
        otherwise each wrong step costs one more reading of the prompt (`forced_rereads`).
        """
        vocab = self.vocab_index()
        result = Generation(text="", prompt_tokens=len(ids))
        split = self._split(ids, cancel)
        result.reused_tokens = split.reused
        stream = TokenStream(self.tokenizer, self.stop_ids, self.stop_strings, ids, stop)
        started = time.perf_counter()
        first_at: float | None = None
        rejected: list[tuple[Any, frozenset[int]]] = []
        while True:
            if cancel.cancelled:
                result.stop_reason = "cancelled"
                break
            left = max_new_tokens - len(stream.ids)
            if left <= 0:
                break
            rejected.clear()
            finished = False

            def on_token(step: Any) -> bool:
                nonlocal first_at, finished
                if first_at is None:
                    first_at = time.perf_counter()
                if cancel.cancelled or finished or rejected:
                    return True
                if len(stream.text) < len(forced):
                    allowed = vocab.allowed(forced[len(stream.text) :], unfinished_word)
                    if step.token_id not in allowed:
                        rejected.append((step.logits, allowed))
                        return True
                finished = stream.add(step.token_id, float(step.log_prob or 0.0))
                return finished

            options = self._options(left, temperature)
            options["return_logits_vocab"] = True
            tokens = self._pieces([*ids[split.end :], *stream.ids])
            self.generator.generate_batch([tokens], callback=on_token, **options, **split.options)
            split = split.again()
            if cancel.cancelled:
                result.stop_reason = "cancelled"
                break
            if finished or not rejected:
                break
            logits, allowed = rejected[0]
            if not allowed:  # no token spells it: nothing can be suggested
                stream.reason = "stop"
                break
            result.forced_rereads += 1
            if stream.add(*best_allowed(logits, allowed)):
                break
        ended = time.perf_counter()
        first = first_at or ended
        result.text = stream.text
        result.token_logprobs = stream.logprobs
        result.new_tokens = len(stream.ids)
        result.prefill_ms = (first - started) * 1000
        result.prefill_done = first_at is not None
        result.decode_ms = (ended - first) * 1000
        if result.stop_reason != "cancelled":
            result.stop_reason = stream.reason
        return result

    def generate_candidates(
        self,
        prompt: str,
        *,
        count: int,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
    ) -> list[Generation]:
        """Up to `count` greedy continuations that begin with different tokens.

        The first is exactly `generate`'s answer; the others start with the next most likely first
        tokens (in that order) and continue greedily. Their prompts are read in one batch.
        """
        with self._lock:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            first_logits: list[Any] = []
            split = self._split(ids, cancel)
            best = self._run([ids], max_new_tokens, stop, cancel, 0.0, split, first_logits)[0]
            if count <= 1 or best.stop_reason == "cancelled" or not first_logits:
                return [best]
            alternatives = self._first_alternatives(first_logits[0], count - 1, best)
            if not alternatives or max_new_tokens <= 1:
                return [best]
            heads = [(token, logprob) for token, logprob in alternatives]
            rest = self._run(
                [[*ids, token] for token, _ in heads],
                max_new_tokens - 1,
                stop,
                cancel,
                0.0,
                split.again(),
                None,
                heads,
            )
            return [best, *[g for g in rest if g.stop_reason != "cancelled"]]

    def _first_alternatives(
        self, logits: Any, count: int, best: Generation
    ) -> list[tuple[int, float]]:
        import numpy as np

        values = np.asarray(logits, dtype=np.float64).reshape(-1)
        logprobs = values - (values.max() + np.log(np.exp(values - values.max()).sum()))
        taken = int(np.argmax(values))
        ranked = np.argsort(-values)[: count + 1 + len(self.stop_ids)]
        chosen: list[tuple[int, float]] = []
        for token in (int(t) for t in ranked):
            if token == taken or token in self.stop_ids:
                continue
            chosen.append((token, float(logprobs[token])))
            if len(chosen) == count:
                break
        return chosen

    def _run(
        self,
        batch: list[list[int]],
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float,
        split: _Split,
        first_logits: list[Any] | None = None,
        heads: list[tuple[int, float]] | None = None,
    ) -> list[Generation]:
        """Generate for every prompt of `batch` at once, reading each as `split` says (every
        prompt of a batch is the same one, or it with one more token); one `Generation` each."""
        results = [Generation(text="", prompt_tokens=len(ids)) for ids in batch]
        if cancel.cancelled:
            for result in results:
                result.stop_reason = "cancelled"
            return results
        stop_ids = self.stop_ids
        streams = []
        for index, ids in enumerate(batch):
            if heads is None:
                streams.append(TokenStream(self.tokenizer, stop_ids, self.stop_strings, ids, stop))
                continue
            # A candidate whose first token was chosen here: its prompt ends with that token.
            stream = TokenStream(self.tokenizer, stop_ids, self.stop_strings, ids[:-1], stop)
            stream.add(*heads[index])
            streams.append(stream)
        done = [False] * len(batch)
        started = time.perf_counter()
        first_at: list[float | None] = [None] * len(batch)
        cancelled = False

        def on_token(step: Any) -> bool:
            nonlocal cancelled
            index = step.batch_id
            if first_at[index] is None:
                first_at[index] = time.perf_counter()
                if first_logits is not None and step.logits is not None:
                    first_logits.append(step.logits)
            if cancel.cancelled:
                cancelled = True
                return True
            if done[index]:
                return True
            done[index] = streams[index].add(step.token_id, float(step.log_prob or 0.0))
            return done[index]

        options = self._options(max_new_tokens, temperature)
        if first_logits is not None:
            options["return_logits_vocab"] = True
        tokens = [self._pieces(ids[split.end :]) for ids in batch]
        self.generator.generate_batch(tokens, callback=on_token, **options, **split.options)
        ended = time.perf_counter()
        for index, (result, stream) in enumerate(zip(results, streams, strict=True)):
            first = first_at[index] or ended
            result.text = stream.text
            result.token_logprobs = stream.logprobs
            result.new_tokens = len(stream.ids)
            result.prefill_ms = (first - started) * 1000
            result.prefill_done = first_at[index] is not None
            result.decode_ms = (ended - first) * 1000
            result.stop_reason = "cancelled" if cancelled else stream.reason
            result.reused_tokens = split.reused
        return results

    def close(self) -> None:
        """Release the engine's model."""
        with self._lock:
            self.generator = None
        _OPEN.discard(self)


# Runners not closed by their owner are closed before the interpreter tears down: a generator
# that ever ran with a token callback and is still alive then makes the process abort
# ("terminate called without an active exception", exit status 134) once torch is imported.
_OPEN: weakref.WeakSet[Ct2Runner] = weakref.WeakSet()


@atexit.register
def _close_open_runners() -> None:
    for runner in list(_OPEN):
        # A daemon thread may still be generating: wait a little for it, never for ever.
        if runner._lock.acquire(timeout=5.0):
            try:
                runner.generator = None
            finally:
                runner._lock.release()
