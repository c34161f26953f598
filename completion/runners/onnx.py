"""The fastest local runner: the model in ONNX Runtime GenAI, 8-bit weights (4-bit on request) in
blocks of 32, int8 arithmetic.

On a 2-core CPU with VNNI this engine decodes the bundled model about 2.6 times faster than
CTranslate2 int8 (`tabloop bench engines`, docs/models.md); it reads a prompt about 2.5 times slower
(on a CPU without VNNI its 8-bit prompt reading is no faster than torch float32), and tries to make
up for it by reading less: the engine holds its KV cache between calls, and the runner keeps
the state of the previous prompt and rolls it back (`rewind_to`) to where the new prompt differs, so
a keystroke reads only what changed and the code after the cursor. Rewrites checked against a
draft (next edits, `generate_with_draft`) keep a cache of their own, so a next edit asked between
keystrokes does not cost the completions that follow it their kept prompt, nor the reverse.

The same request always gives the same text, whatever came before it. The engine computes a token's
state identically whether its prompt is read at once or in chunks of two or more tokens (its matrix
kernels treat rows independently); a chunk of one token takes another kernel and rounds
differently. So prompts are read in chunks of at least two tokens (the last two
are always read again), and the states of generated tokens, computed one at a time, are never
reused. `tests/completion/test_onnx_runner.py` holds the engine to this.

The prompt is read in chunks of `CHUNK` tokens, so a cancelled request stops within one chunk; every
generated token is chosen here from the engine's scores: the stop rule, the log-probability for the
gate, token healing's constraint and the candidates' different first tokens cost nothing extra.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from common.memory import IdleTrim, release_mapped_file, trim_heap
from completion.fim import template_for
from completion.healing import VocabIndex, best_allowed
from completion.runners.base import PreparedModel
from completion.runners.conversion import Progress as ConversionProgress
from completion.runners.conversion import checksum, clear_failure, ensure_converted
from completion.runners.converted import ConvertedRunner
from completion.runners.ct2 import default_threads
from completion.runners.draft import RewriteDrafter, respeller
from completion.runners.loading import resolve_source
from completion.runners.prefix_cache import common_prefix_length
from completion.runners.tokens import TokenStream, family_of, stop_ids
from completion.types import CancelToken, Generation, StopRule

log = logging.getLogger(__name__)

Precision = Literal["int4", "int8"]
Purpose = Literal["complete", "edit"]  # which cache a call reads its prompt into

CHUNK = 24  # prompt tokens per engine call: about 100 ms on 2 cores, the longest a cancel waits
MIN_CHUNK = 2  # a one-token read takes another kernel (see above)
# Tokens of KV cache the engine sets aside at least: 25 MB here, a completion prompt (512 tokens
# by default, `completion.contextTokens`) and its answer; a longer prompt gets a larger cache, in
# steps of `LENGTH_STEP` tokens (12 MB): a next-edit prompt and its rewrite (at most about 1,400
# tokens by default) get 1,536 tokens, 37 MB, where the next power of two would hold 50 MB.
MIN_LENGTH = 1024
LENGTH_STEP = 512
# Speculative edits: most draft tokens checked per pass. On a 2-core CPU without VNNI a pass of
# 17 tokens takes about 7 one-token passes' time (the engine's many-row kernel is compute-bound).
EDIT_DRAFT_TOKENS = 16


def release_weights_file(path: Path) -> None:
    """Give back the pages of the model's weights file the engine read once while loading.

    The engine maps `model.onnx.data` and packs each matrix, with its scales, into a buffer of its
    own; the scales' pages (about 60 MB for the bundled model) stay resident though nothing reads
    them again. Only the token embedding is read from the file while serving, a row per token;
    its rows come back as tokens are read (`common.memory.release_mapped_file`; docs/models.md).
    """
    for weights in path.glob("*.onnx.data"):
        released = release_mapped_file(weights)
        if released:
            log.debug("gave back the pages of %s (%d MB mapped)", weights.name, released >> 20)


def _log_softmax_at(row: np.ndarray, token: int) -> float:
    top = float(row.max())
    return float(row[token]) - (top + math.log(float(np.exp(row - top).sum())))


class OnnxRunner(ConvertedRunner):
    """A causal LM built for ONNX Runtime GenAI, run in this process, one request at a time."""

    ENGINE = "onnxruntime"
    MODEL_TAG = "ort"

    forces_text = True  # `generate(forced_text=...)`: token healing (`completion.healing`)

    def __init__(
        self,
        model: str,
        cache_dir: Path,
        *,
        precision: Precision = "int8",
        threads: int = 0,
        family: str | None = None,
        progress: ConversionProgress | None = None,
        reuse_prefix: bool = True,
    ) -> None:
        import importlib.metadata

        from tokenizers import Tokenizer

        started = time.perf_counter()
        self.source = resolve_source(model, cache_dir)
        self.cache_dir = cache_dir
        self.compute_type = precision
        self.path = ensure_converted(
            self.source, precision, cache_dir, progress=progress, engine="onnxruntime"
        )
        self.base_path = self.path
        self.threads = threads or default_threads()
        self.model: Any = self._load(self.path)
        clear_failure(model, f"onnxruntime:{precision}", cache_dir)
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.engine_version = importlib.metadata.version("onnxruntime-genai")
        self.weights_sha256 = checksum(self.path) or ""
        self.base_model_id = f"{self.source.name}@{self.source.revision}"
        self.adapter: Path | None = None
        self.model_id = self._model_id(None)
        self.family = family or family_of(self.tokenizer, self.source.name)
        self.stop_strings = template_for(self.family).stop_tokens
        self.stop_ids = frozenset(stop_ids(self.path, self.tokenizer, self.stop_strings))
        self.reuse_prefix = reuse_prefix
        self._lock = threading.Lock()
        self._idle = IdleTrim()  # the heap's freed pages go back in pauses between requests
        self._vocab: VocabIndex | None = None
        # The active cache: its generator, the tokens it can hold, and the prompt tokens whose
        # state it holds; the other purpose's cache waits in `_parked`.
        self._generator: Any = None
        self._length = 0
        self._kept: list[int] = []
        self._purpose: Purpose = "complete"
        self._parked: dict[Purpose, tuple[Any, int, list[int]]] = {}
        self._random = random.Random()
        self.edit_draft_tokens = EDIT_DRAFT_TOKENS
        trim_heap()  # what reading the weights and the tokenizer left free: about 100 MB
        release_weights_file(self.path)
        self.load_s = time.perf_counter() - started
        log.info(
            "loaded %s in ONNX Runtime GenAI %s (%s, %d threads) in %.1fs",
            self.model_id,
            self.engine_version,
            precision,
            self.threads,
            self.load_s,
        )

    # -- loading ----------------------------------------------------------------------------

    def _load(self, path: Path) -> Any:
        import onnxruntime_genai as og

        config = og.Config(str(path))
        # No memory arena: it keeps the largest buffers a request ever needed (about 50 MB more
        # after a typing session, docs/models.md); decoding is as fast without it.
        options = {
            "intra_op_num_threads": self.threads,
            "inter_op_num_threads": 1,
            "enable_cpu_mem_arena": False,
        }
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        return og.Model(config)

    def install(self, prepared: PreparedModel) -> None:
        """Serve `prepared` from the next request on; a request in progress finishes first."""
        with self._lock:
            if self.model is None:
                raise RuntimeError("the runner is closed")
            self.model = prepared.generator  # this engine's loaded model
            self._generator, self._length, self._kept = None, 0, []
            self._parked.clear()
            self.path = prepared.path
            self.adapter = prepared.adapter
            self.model_id = prepared.model_id
            self.weights_sha256 = prepared.weights_sha256
        trim_heap()  # the model served before, and its caches, are gone
        release_weights_file(prepared.path)
        log.info("now serving %s", self.model_id)

    def describe(self) -> dict[str, Any]:
        """What `tabloop doctor` reports about the engine."""
        return {
            "engine": "onnxruntime-genai",
            "engine_version": self.engine_version,
            "compute_type": f"{self.compute_type} weights, int8 arithmetic",
            "threads": self.threads,
            "converted_model": str(self.path),
            "converted_sha256": self.weights_sha256,
            "adapter": str(self.adapter) if self.adapter else None,
        }

    # -- what the engine asks -----------------------------------------------------------------

    def _reusable(self, ids: list[int], kept: list[int] | None = None) -> int:
        """How many first tokens of `ids` the kept state (`kept`, else the active cache's)
        serves (0: read it all)."""
        if not self.reuse_prefix:
            return 0
        held = self._kept if kept is None else kept
        reused = min(common_prefix_length(held, ids), len(ids) - MIN_CHUNK)
        return reused if reused >= MIN_CHUNK else 0

    def _completion_kept(self) -> list[int]:
        if self._purpose == "complete":
            return self._kept
        return self._parked.get("complete", (None, 0, []))[2]

    def tokens_to_read(self, prompt: str) -> int:
        """Prompt tokens the engine would compute for completion prompt `prompt` now."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return len(ids) - self._reusable(ids, self._completion_kept())

    @property
    def kept_tokens(self) -> int:
        """Prompt tokens whose state the engine holds for the next completion request."""
        return len(self._completion_kept())

    @property
    def output_variant(self) -> str:
        """Outputs do not depend on what was kept (see the module's docstring)."""
        return ""

    # -- generation ---------------------------------------------------------------------------

    def _use(self, purpose: Purpose) -> None:
        """Make `purpose`'s cache the active one, parking the other's as it is."""
        if purpose != self._purpose:
            self._parked[self._purpose] = (self._generator, self._length, self._kept)
            self._generator, self._length, self._kept = self._parked.pop(purpose, (None, 0, []))
            self._purpose = purpose

    def _generator_for(self, needed: int) -> Any:
        """The generator, made again (its state lost) when it cannot hold `needed` tokens."""
        import onnxruntime_genai as og

        if self._generator is None or needed > self._length:
            length = max(MIN_LENGTH, -(-needed // LENGTH_STEP) * LENGTH_STEP)
            params = og.GeneratorParams(self.model)
            params.set_search_options(max_length=length, do_sample=False)
            self._generator = None  # let the old cache go before the new one is set aside
            self._generator = og.Generator(self.model, params)
            self._length, self._kept = length, []
        return self._generator

    def _read(self, ids: list[int], max_new_tokens: int, cancel: CancelToken) -> tuple[int, bool]:
        """Bring the generator to the end of prompt `ids`: (tokens reused, whether it got there)."""
        generator = self._generator_for(len(ids) + max_new_tokens)
        reused = self._reusable(ids)
        if generator.token_count() != reused:
            generator.rewind_to(reused)
        self._kept = ids[:reused]
        position = reused
        while position < len(ids):
            if cancel.cancelled:
                return reused, False
            end = min(position + CHUNK, len(ids))
            if len(ids) - end < MIN_CHUNK:
                end = len(ids)
            generator.append_tokens(ids[position:end])
            position = end
            self._kept = ids[:position]
        return reused, True

    def _scores(self) -> np.ndarray:
        return np.asarray(self._generator.get_logits(), dtype=np.float32).reshape(-1)

    def _choose(
        self,
        row: np.ndarray,
        stream: TokenStream,
        temperature: float,
        forced: str,
        unfinished_word: bool,
    ) -> tuple[int, float] | None:
        """The next token and its log-probability (None: no token can spell the typed text)."""
        if forced and len(stream.text) < len(forced):
            allowed = self.vocab_index().allowed(forced[len(stream.text) :], unfinished_word)
            return best_allowed(row, allowed) if allowed else None
        if temperature > 0:
            scaled = row.astype(np.float64) / temperature
            weights = np.exp(scaled - scaled.max())
            token = self._random.choices(range(row.size), weights=weights.tolist())[0]
        else:
            token = int(np.argmax(row))
        return token, _log_softmax_at(row, token)

    def _decode(
        self,
        result: Generation,
        stream: TokenStream,
        row: np.ndarray,
        max_new_tokens: int,
        cancel: CancelToken,
        temperature: float = 0.0,
        forced: str = "",
        unfinished_word: bool = False,
    ) -> None:
        """Generate from scores `row` until the stream stops, `max_new_tokens`, or a cancel."""
        for step in range(max_new_tokens):
            if cancel.cancelled:
                result.stop_reason = "cancelled"
                break
            chosen = self._choose(row, stream, temperature, forced, unfinished_word)
            if chosen is None:
                stream.reason = "stop"
                break
            if stream.add(*chosen) or step == max_new_tokens - 1:
                break
            self._generator.append_tokens([chosen[0]])
            result.decode_passes += 1
            row = self._scores()
        result.text = stream.text
        result.token_logprobs = stream.logprobs
        result.new_tokens = len(stream.ids)
        if result.stop_reason != "cancelled":
            result.stop_reason = stream.reason

    def _stream(self, ids: list[int], stop: StopRule) -> TokenStream:
        return TokenStream(self.tokenizer, self.stop_ids, self.stop_strings, ids, stop)

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

        With `forced_text`, the output starts with exactly that text; with `unfinished_word` too,
        a word character follows it (`VocabIndex.allowed`).
        """
        with self._lock, self._idle.working():
            self._use("complete")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            result, row = self._prefill(ids, max_new_tokens, cancel)
            if row is None:
                return result
            started = time.perf_counter()
            self._decode(
                result,
                self._stream(ids, stop),
                row,
                max_new_tokens,
                cancel,
                temperature,
                forced_text,
                unfinished_word,
            )
            result.decode_ms = (time.perf_counter() - started) * 1000
            return result

    def generate_with_draft(
        self,
        prompt: str,
        *,
        draft: str,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
    ) -> Generation:
        """Greedy continuation of `prompt`, checking up to `edit_draft_tokens` tokens of `draft`
        (the text the output likely rewrites, `RewriteDrafter`) per engine call.

        The engine scores every token of a call (its `logits` output), so the token fed and a
        draft after it are checked at once: the greedy tokens are taken in order, exactly as
        `_decode` takes them, while they agree with the draft; the first one that differs is the
        model's own, and the cache is rewound to the last agreed token. A call of two or more
        tokens takes the engine's many-row kernel, whose rounding differs from the one-token
        kernel's; a token whose two best scores lie closer than that difference may come out
        differently from `generate`'s (docs/models.md measures how often).
        """
        with self._lock, self._idle.working():
            self._use("edit")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            result, row = self._prefill(ids, max_new_tokens + 1, cancel)
            if row is None:
                return result
            started = time.perf_counter()
            tokenizer = self.tokenizer
            draft_ids = tokenizer.encode(draft, add_special_tokens=False).ids
            respell = respeller(
                lambda tokens: str(tokenizer.decode(tokens, skip_special_tokens=False)),
                lambda text: list(tokenizer.encode(text, add_special_tokens=False).ids),
            )
            drafter = RewriteDrafter(draft_ids, context=ids, respell=respell)
            self._decode_drafted(
                result, self._stream(ids, stop), row, drafter, max_new_tokens, cancel
            )
            result.decode_ms = (time.perf_counter() - started) * 1000
            return result

    def _decode_drafted(
        self,
        result: Generation,
        stream: TokenStream,
        row: np.ndarray,
        drafter: RewriteDrafter,
        max_new_tokens: int,
        cancel: CancelToken,
    ) -> None:
        """Greedy decoding from scores `row` that checks `drafter`'s tokens (see above)."""
        generator = self._generator
        rows: list[np.ndarray] = [row]
        draft: list[int] = []
        done = max_new_tokens <= 0
        while not done:
            fresh: int | None = None
            accepted = 0
            for index, scores in enumerate(rows):
                if cancel.cancelled:
                    result.stop_reason = "cancelled"
                    done = True
                    break
                token = int(np.argmax(scores))
                if stream.add(token, _log_softmax_at(scores, token)):
                    done = True
                    break
                if len(stream.ids) >= max_new_tokens:
                    done = True
                    break
                drafter.append(token)
                if index < len(draft) and token == draft[index]:
                    accepted += 1  # its state is already in the cache
                    continue
                fresh = token
                break
            if draft:
                result.draft_accepted += accepted
                # The cache holds the fed tokens; keep the last token and the agreed draft.
                generator.rewind_to(generator.token_count() - len(draft) + accepted)
            if done or fresh is None:
                break
            remaining = max_new_tokens - len(stream.ids)
            draft = drafter.propose(min(self.edit_draft_tokens, remaining))
            generator.append_tokens([fresh, *draft])
            result.decode_passes += 1
            if draft:
                result.verify_steps += 1
                result.draft_tokens += len(draft)
            rows = list(
                np.asarray(generator.get_output("logits"), dtype=np.float32).reshape(
                    1 + len(draft), -1
                )
            )
        result.text = stream.text
        result.token_logprobs = stream.logprobs
        result.new_tokens = len(stream.ids)
        if result.stop_reason != "cancelled":
            result.stop_reason = stream.reason

    def _prefill(
        self, ids: list[int], max_new_tokens: int, cancel: CancelToken
    ) -> tuple[Generation, np.ndarray | None]:
        """Read prompt `ids`: the generation so far and the first token's scores (None when
        cancelled first)."""
        result = Generation(text="", prompt_tokens=len(ids))
        if self.model is None:
            raise RuntimeError("the runner is closed")
        if not ids or cancel.cancelled:
            result.stop_reason = "cancelled" if cancel.cancelled else "stop"
            return result, None
        started = time.perf_counter()
        result.reused_tokens, done = self._read(ids, max_new_tokens, cancel)
        result.prefill_ms = (time.perf_counter() - started) * 1000
        if not done:
            result.stop_reason = "cancelled"
            return result, None
        result.prefill_done = True
        return result, self._scores()

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
        tokens (in that order) and continue greedily from the same prompt state.
        """
        with self._lock, self._idle.working():
            self._use("complete")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            best, row = self._prefill(ids, max_new_tokens, cancel)
            if row is None:
                return [best]
            started = time.perf_counter()
            self._decode(best, self._stream(ids, stop), row, max_new_tokens, cancel)
            best.decode_ms = (time.perf_counter() - started) * 1000
            if count <= 1 or best.stop_reason == "cancelled" or max_new_tokens <= 1:
                return [best]
            found = [best]
            for token in self._alternatives(row, count - 1):
                if cancel.cancelled:
                    break
                started = time.perf_counter()
                other = Generation(text="", prompt_tokens=len(ids), reused_tokens=len(ids))
                stream = self._stream(ids, stop)
                if stream.add(token, _log_softmax_at(row, token)):
                    continue
                self._generator.rewind_to(len(ids))
                self._generator.append_tokens([token])
                self._decode(other, stream, self._scores(), max_new_tokens - 1, cancel)
                other.decode_ms = (time.perf_counter() - started) * 1000
                if other.stop_reason != "cancelled":
                    found.append(other)
            return found

    def _alternatives(self, row: np.ndarray, count: int) -> list[int]:
        """The next most likely first tokens after the greedy one (never a stop token)."""
        taken = int(np.argmax(row))
        ranked = np.argsort(-row)[: count + 1 + len(self.stop_ids)]
        chosen = [int(t) for t in ranked if int(t) != taken and int(t) not in self.stop_ids]
        return chosen[:count]

    def close(self) -> None:
        """Release the engine's model and its cache."""
        with self._lock:
            self._generator = None
            self._parked.clear()
            self.model = None
            self._kept = []
