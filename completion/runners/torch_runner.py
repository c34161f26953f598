"""The in-process model runner: transformers + torch on the CPU, with a hand-written decode loop.

`model.generate` would do the decoding, but the editor needs things it does not give together:
a cancellation check between every two tokens (a newer keystroke supersedes the request), the
stop rule applied to decoded text after each token, each token's log-probability for the gate
policy, and a KV cache kept across calls so consecutive prompts prefill only what changed.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from completion.fim import UnknownFamily, detect_family, template_for
from completion.healing import VocabIndex, best_allowed, token_texts
from completion.runners.draft import Drafter, PromptLookupDrafter, RewriteDrafter, respeller
from completion.runners.loading import Dtype, load_model, resolve_dtype, resolve_source
from completion.runners.prefix_cache import CacheEntry, PrefixCache, crop_cache, crop_layers
from completion.types import Cancelled, CancelToken, Generation, StopRule

log = logging.getLogger(__name__)

# Prompt tokens per forward pass of the prefill. Cancellation is checked before every decoder
# layer of a prefill pass (`_interruptible`), so the chunk's size does not bound how long a
# cancelled request holds the model: one layer's share of a pass does.
PREFILL_CHUNK_TOKENS = 64
# In bfloat16 on a CPU with AMX a pass of 64 tokens leaves the tile units mostly idle: a
# 512-token prompt took 1.05 s in chunks of 64, 0.51 s in chunks of 256 and 0.41 s whole on a
# 2-core Xeon, and a rewrite's 660-token prompt with its 160-token draft 0.92 s a call in chunks
# of 512 against 0.99 s in chunks of 256 and 0.95 s whole (docs/next-edit.md).
BFLOAT16_PREFILL_CHUNK_TOKENS = 512
# Speculative decoding: most drafted tokens per verification pass, longest n-gram looked up.
DEFAULT_DRAFT_TOKENS = 8
DEFAULT_DRAFT_NGRAM = 4
DEFAULT_DRAFT_MIN_NGRAM = 3
# Speculative edits (`generate_with_draft`): most draft tokens of a rewrite checked per pass.
DEFAULT_EDIT_DRAFT_TOKENS = 16
# In bfloat16 a pass costs about the same for 1 token (97 ms) as for 16 (111 ms) on that Xeon: the
# weights are read once per pass, and the tile units compute the extra tokens almost for free. A
# whole window (up to `nextEdit.windowTokens`, 256) fits one pass.
BFLOAT16_EDIT_DRAFT_TOKENS = 256
# After a mismatch the next draft is twice the tokens the last one had right, at least this many:
# a model that writes new text (its drafts fail at once) pays for short passes, and one that copies
# the window again after a changed token gets the long draft back within a pass or two.
MIN_EDIT_DRAFT_TOKENS = 8


def default_threads() -> int:
    """torch threads when the user sets none: every core but one, which the editor needs.

    Measured on a busy 2-core machine, one thread decoded 1.5x faster than two: threads that
    wait on each other at every matmul lose more than they gain when the cores are contended.
    """
    return max(1, (os.cpu_count() or 1) - 1)


def _cache_kwarg(model: Any) -> str:
    """forward()'s KV-cache keyword: `cache` in new transformers, `past_key_values` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class _Interrupted(Exception):
    """A forward pass stopped before one of its decoder layers: its request was cancelled."""


def _decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers: the module list as long as its configured layer count."""
    import torch

    count = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    return []


def _new_cache(config: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


class _Output:
    """The text decoded so far and the rules that end it, shared by both decode loops."""

    def __init__(
        self,
        runner: TorchRunner,
        anchor: list[int],
        stop: StopRule,
        max_new_tokens: int,
        result: Generation,
    ) -> None:
        self.runner = runner
        self.anchor = anchor
        self.stop = stop
        self.max_new_tokens = max_new_tokens
        self.result = result
        self.generated: list[int] = []
        self.ends: list[int] = []  # text length after each generated token
        self.text = ""
        result.stop_reason = "length"

    def add(self, token: int, logprob: float) -> bool:
        """Take the next token; True when the generation ends with it (its stop_reason set)."""
        result = self.result
        if token in self.runner._stop_ids:
            result.stop_reason = "eos"
            return True
        self.generated.append(token)
        result.token_logprobs.append(logprob)
        self.text = self.runner._decode(self.anchor, self.generated)
        self.ends.append(len(self.text))
        cut = self.runner._cut(self.text, self.stop)
        if cut is not None:
            self.text = self.text[:cut]
            # Keep the log-probabilities of the tokens that contributed to the kept text.
            kept = next((i + 1 for i, end in enumerate(self.ends) if end >= cut), len(self.ends))
            del result.token_logprobs[kept if cut > 0 else 0 :]
            result.stop_reason = "stop"
            return True
        return len(self.generated) >= self.max_new_tokens


class TorchRunner:
    """A causal LM run in this process, one request at a time."""

    forces_text = True  # `generate(forced_text=...)`: token healing (`completion.healing`)

    def __init__(
        self,
        model: str,
        cache_dir: Path,
        *,
        dtype: Dtype = "auto",
        threads: int = 0,
        reuse_cache: bool = True,
        cache_entries: int = 2,
        cache_max_tokens: int = 4096,
        family: str | None = None,
        seed: int = 0,
        speculative: bool = False,
        speculative_tokens: int = DEFAULT_DRAFT_TOKENS,
        draft_ngram: int = DEFAULT_DRAFT_NGRAM,
        draft_min_ngram: int = DEFAULT_DRAFT_MIN_NGRAM,
        edit_draft_tokens: int | None = None,
        adapter: Path | None = None,
        pack_weights: bool | None = None,
    ) -> None:
        import torch

        torch.set_num_threads(threads or default_threads())
        started = time.perf_counter()
        self.source = resolve_source(model, cache_dir)
        self.cache_dir = cache_dir
        self.dtype = resolve_dtype(dtype)
        self.tokenizer, self.model = load_model(self.source, self.dtype, cache_dir)
        self.load_s = time.perf_counter() - started

        self.model_id = f"{self.source.name}@{self.source.revision}"
        self.family = family or self._detect_family()
        self._cache_kwarg = _cache_kwarg(self.model)
        self._prefix_cache = PrefixCache(cache_entries if reuse_cache else 0, cache_max_tokens)
        self._stop_ids = self._collect_stop_ids()
        self._stop_strings = template_for(self.family).stop_tokens
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        # Speculative decoding applies to greedy decoding only; sampling always runs plain.
        self.speculative = speculative
        self.speculative_tokens = max(1, speculative_tokens)
        self.draft_ngram = draft_ngram
        self.draft_min_ngram = draft_min_ngram
        if edit_draft_tokens is None:
            edit_draft_tokens = (
                BFLOAT16_EDIT_DRAFT_TOKENS
                if self.dtype == "bfloat16"
                else DEFAULT_EDIT_DRAFT_TOKENS
            )
        self.edit_draft_tokens = max(1, edit_draft_tokens)
        self.prefill_chunk_tokens = (
            BFLOAT16_PREFILL_CHUNK_TOKENS if self.dtype == "bfloat16" else PREFILL_CHUNK_TOKENS
        )
        self.base_model_id = self.model_id
        self.adapter: Path | None = None
        self._base_shapes: dict[str, tuple[int, int]] | None = None
        # Packed weights in bfloat16 unless `pack_weights` is False (`completion.runners.packed`);
        # float32 stays the plain reference, and its adapters stay separate layers, which need
        # plain weights.
        self.pack_weights = self.dtype == "bfloat16" and pack_weights is not False
        self.packed_linears = 0
        if self.pack_weights:
            from completion.adapters import linear_shapes

            self._base_shapes = linear_shapes(self.model)  # adapters are checked against these
            self.packed_linears = self._pack(self.model)
        self._base_model = self.model
        self._vocab: VocabIndex | None = None
        options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
        self._respell = respeller(  # a rewrite's text written in shorter tokens (RewriteDrafter)
            lambda ids: str(self.tokenizer.decode(ids, **options)),
            lambda text: list(self.tokenizer.encode(text, add_special_tokens=False)),
        )
        log.info("loaded %s (%s) in %.1fs", self.model_id, self.dtype, self.load_s)
        if adapter is not None:
            self.swap_adapter(adapter)

    def swap_adapter(self, adapter: Path | None) -> None:
        """Serve `adapter` (a LoRA directory, `completion.adapters`) on the base model from the
        next request on, or the base model alone for None; no restart.

        The adapter is checked completely before the model is touched: a corrupt one raises
        `AdapterError` and what was serving keeps serving. A request in progress finishes first.

        In bfloat16 the adapter is merged into a fresh copy of the base weights (read again from
        the cache, seconds): peft's separate LoRA layers doubled the time of a rewrite there
        (2.5 s against 1.2 s, docs/next-edit.md), while merged weights cost nothing per token.
        In float32 the layers stay separate (the reference output, and swaps without a reload).
        """
        from completion.adapters import apply_adapter, check_adapter, linear_shapes, remove_adapter

        if self.dtype == "int8":
            raise ValueError("adapters need a float model: set completion.dtype to float32")
        if self._base_shapes is None:
            self._base_shapes = linear_shapes(self._base_model)
        manifest = None
        if adapter is not None:
            manifest = check_adapter(adapter, self.base_model_id, self._base_shapes)
        if self.dtype == "bfloat16":
            merged = self._merged(adapter)
            with self._lock:
                self._prefix_cache.clear()  # its keys and values came from the other weights
                self.model = self._base_model = merged
                self.adapter = adapter
                self.model_id = self.base_model_id + (
                    f"+{manifest.get('version', adapter.name)}" if manifest and adapter else ""
                )
            log.info("now serving %s (merged)", self.model_id)
            return
        with self._lock:
            self._prefix_cache.clear()  # its keys and values came from the other weights
            base = remove_adapter(self.model)
            self.model = (
                base
                if adapter is None
                else apply_adapter(base, adapter, self.base_model_id, self._base_shapes)
            )
            self.adapter = adapter
            suffix = f"+{manifest.get('version', adapter.name)}" if manifest and adapter else ""
            self.model_id = f"{self.base_model_id}{suffix}"
        log.info("now serving %s", self.model_id)

    def _merged(self, adapter: Path | None) -> Any:
        """The base weights read again, with `adapter` merged into them (None: the base)."""
        from completion.adapters import merge_into

        if adapter is None and self.adapter is None:
            return self.model
        _, model = load_model(self.source, self.dtype, self.cache_dir)
        if adapter is not None:
            merge_into(model, adapter)
        if self.pack_weights:
            self._pack(model)
        return model

    @staticmethod
    def _pack(model: Any) -> int:
        from completion.runners.packed import pack_linears

        location = Path(str(getattr(model, "name_or_path", "")))
        mapped = sorted(location.glob("*.safetensors")) if location.is_dir() else []
        return pack_linears(model, mapped=mapped)

    def _detect_family(self) -> str:
        specials = list(getattr(self.tokenizer, "all_special_tokens", []))
        specials += list(getattr(self.tokenizer, "get_added_vocab", dict)().keys())
        try:
            return detect_family(specials, self.source.location + "/" + self.source.name)
        except UnknownFamily:
            raise UnknownFamily(
                f"cannot tell the fill-in-the-middle format of {self.source.name}: "
                "set completion.fimTemplate"
            ) from None

    def _collect_stop_ids(self) -> set[int]:
        ids: set[int] = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        for value in eos if isinstance(eos, list) else [eos]:
            if isinstance(value, int):
                ids.add(value)
        if isinstance(self.tokenizer.eos_token_id, int):
            ids.add(self.tokenizer.eos_token_id)
        vocab = self.tokenizer.get_vocab()
        for token in template_for(self.family).stop_tokens:
            if token in vocab:
                ids.add(vocab[token])
        return ids

    def count_tokens(self, text: str) -> int:
        """Number of tokens `text` takes in this model's tokenizer."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def tokens_to_read(self, prompt: str) -> int:
        """Prompt tokens this runner would compute for `prompt` now: those its KV-prefix cache
        does not hold (`completion.cache`)."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return len(ids) - self._prefix_cache.reusable(ids)

    @contextmanager
    def _interruptible(self, cancel: CancelToken) -> Iterator[None]:
        """Passes inside check `cancel` before each decoder layer and raise `_Interrupted`:
        a keystroke stops a long prompt pass within one layer's time (a 512-token pass of the
        0.5B model in bfloat16 is 24 layers of about 17 ms). The layers before the stop have
        written the pass's keys and values, the others not: `crop_layers` puts them level."""

        def check(module: Any, args: Any) -> None:
            if cancel.cancelled:
                raise _Interrupted

        handles = [layer.register_forward_pre_hook(check) for layer in _decoder_layers(self.model)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _forward(self, input_ids: list[int], cache: Any) -> Any:
        import torch

        tensor = torch.tensor([input_ids], dtype=torch.long)
        # Only the last position's logits are needed; skipping the rest saves the LM-head matmul.
        output = self.model(
            input_ids=tensor, use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache}
        )
        return output.logits[0, -1].float()

    def _forward_rows(self, input_ids: list[int], cache: Any, rows: int = 0) -> list[Any]:
        """Logits after each of the last `rows` of `input_ids` (all when 0), in one pass: for
        checking a draft."""
        import torch

        rows = rows or len(input_ids)
        if rows == 1:
            return [self._forward(input_ids, cache)]
        tensor = torch.tensor([input_ids], dtype=torch.long)
        output = self.model(
            input_ids=tensor,
            use_cache=True,
            logits_to_keep=rows,
            **{self._cache_kwarg: cache},
        )
        # Rows stay in the model's dtype: a row is converted when it is read, and a draft's
        # rows after its first miss never are.
        return list(output.logits[0])

    def _next_token(self, logits: Any, temperature: float) -> tuple[int, float]:
        """The next token of one row of logits, and its log-probability.

        Greedy picks take numpy's argmax (the first of equal maxima, as torch's): over the
        152k-token vocabulary of the bundled model it is about 5x faster than torch's on a CPU,
        and a rewrite reads a row per token it writes."""
        import numpy as np
        import torch

        logits = logits.float()
        if temperature <= 0:
            token = int(np.argmax(logits.numpy()))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=self._generator))
        return token, float(logits[token] - torch.logsumexp(logits, dim=-1))

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

        With `forced_text`, the output starts with exactly that text: each step until it is
        written takes the most likely token that fits it (`completion.healing`); with
        `unfinished_word` too, a word character follows it.
        """
        import torch

        with self._lock, torch.inference_mode():
            return self._generate(
                prompt, max_new_tokens, stop, cancel, temperature, forced_text, unfinished_word
            )

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
        (the text the output likely rewrites, `RewriteDrafter`) per forward pass: the text of
        `generate(prompt, temperature=0.0)` in fewer passes."""
        import torch

        draft_ids: list[int] = self.tokenizer(draft, add_special_tokens=False)["input_ids"]
        with self._lock, torch.inference_mode():
            return self._generate(prompt, max_new_tokens, stop, cancel, 0.0, rewrite_of=draft_ids)

    def read_prefix(
        self,
        text: str,
        cancel: CancelToken,
        *,
        pass_tokens: int | None = None,
    ) -> int:
        """Compute the keys and values of `text` into the KV-prefix cache, so that a prompt
        starting with it reads only the rest: the tokens computed now (0 when an entry holds
        them all). Read in passes of `pass_tokens` (the prompt's, `prefill_chunk_tokens`, when
        None), and stopped as a prompt is, before any decoder layer: a stopped read keeps the
        passes it finished and raises `Cancelled`."""
        import torch

        size = max(1, pass_tokens or self.prefill_chunk_tokens)
        with self._lock, torch.inference_mode():
            ids: list[int] = self.tokenizer(text)["input_ids"]
            if not ids or self._prefix_cache.holds(ids):
                return 0
            entry, reused = self._prefix_cache.take(ids)
            if entry is None:
                entry = CacheEntry([], _new_cache(self.model.config))
            pending = ids[reused:]
            while pending:
                chunk, pending = pending[:size], pending[size:]
                try:
                    with self._interruptible(cancel):
                        self._forward_rows(chunk, entry.cache, 1)
                except _Interrupted:
                    if crop_layers(entry.cache, len(entry.tokens)) and entry.tokens:
                        self._prefix_cache.put(entry)
                    raise Cancelled(cancel.reason or "cancelled") from None
                entry.tokens.extend(chunk)
            self._prefix_cache.put(entry)
            return len(ids) - reused

    def vocab_index(self) -> VocabIndex:
        """The decoded text of every token, built at the first healed request."""
        if self._vocab is None:
            size = max(len(self.tokenizer), int(getattr(self.model.config, "vocab_size", 0)))
            ids = [[token] for token in range(size)]
            options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
            decoded = self.tokenizer.batch_decode(ids, **options)
            raw = [str(p or "") for p in self.tokenizer.convert_ids_to_tokens(list(range(size)))]
            special = set(getattr(self.tokenizer, "all_special_ids", []))
            special |= set(getattr(self.tokenizer, "get_added_vocab", dict)().values())
            self._vocab = VocabIndex(token_texts(decoded, raw), special | self._stop_ids)
        return self._vocab

    def _generate(
        self,
        prompt: str,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float,
        forced_text: str = "",
        unfinished_word: bool = False,
        rewrite_of: list[int] | None = None,
    ) -> Generation:
        """`generate` under the lock; with `rewrite_of` (the tokens the output likely rewrites),
        greedy decoding checks drafts of it (`RewriteDrafter`, with the prompt as its context)."""
        prompt_ids: list[int] = self.tokenizer(prompt)["input_ids"]
        drafter = (
            RewriteDrafter(rewrite_of, context=prompt_ids, respell=self._respell)
            if rewrite_of is not None
            else None
        )
        result = Generation(text="", prompt_tokens=len(prompt_ids))
        if cancel.cancelled:
            result.stop_reason = "cancelled"
            return result
        started = time.perf_counter()
        entry, reused = self._prefix_cache.take(prompt_ids)
        if entry is None:
            entry = CacheEntry([], _new_cache(self.model.config))
        result.reused_tokens = reused
        # A rewrite's draft is known before the model writes anything: its first tokens are
        # checked in the prompt's last pass, which saves a pass (about 0.1 s in bfloat16).
        draft: list[int] = []
        # Prefill in chunks, checking for cancellation before every layer of a pass: a long cold
        # prompt takes seconds on a CPU, and a newer keystroke should not wait for it. The
        # chunks read before the cancellation stay in the prefix cache, so the next prompt
        # (usually the same text plus a little) starts from there.
        pending = prompt_ids[reused:]
        while True:
            size = self.prefill_chunk_tokens
            chunk, pending = pending[:size], pending[size:]
            if drafter is not None and max_new_tokens > 0 and not pending:
                draft = drafter.propose(min(self.edit_draft_tokens, max_new_tokens))
                chunk = chunk + draft
            try:
                with self._interruptible(cancel):
                    rows = self._forward_rows(chunk, entry.cache, len(draft) + 1)
            except _Interrupted:
                result.prefill_ms = (time.perf_counter() - started) * 1000
                result.stop_reason = "cancelled"
                if crop_layers(entry.cache, len(entry.tokens)):
                    self._prefix_cache.put(entry)  # the chunks read before this pass
                return result
            entry.tokens.extend(chunk)
            if not pending:
                break
            if cancel.cancelled:
                result.prefill_ms = (time.perf_counter() - started) * 1000
                result.stop_reason = "cancelled"
                self._prefix_cache.put(entry)
                return result
        result.prefill_ms = (time.perf_counter() - started) * 1000
        result.prefill_done = True

        decode_started = time.perf_counter()
        output = _Output(self, prompt_ids[-1:], stop, max_new_tokens, result)
        if forced_text:
            # Healing takes the plain loop: a drafted token is not checked against the text.
            self._decode_plain(
                rows[0], entry, output, cancel, temperature, forced_text, unfinished_word
            )
        elif drafter is not None:
            if draft:
                result.verify_steps += 1
                result.draft_tokens += len(draft)
                result.prompt_pass_draft_tokens = len(draft)
            self._decode_speculative(
                drafter, self.edit_draft_tokens, rows, draft, entry, output, cancel, adapt=True
            )
        elif self.speculative and temperature <= 0:
            lookup = PromptLookupDrafter(
                prompt_ids, max_ngram=self.draft_ngram, min_ngram=self.draft_min_ngram
            )
            self._decode_speculative(
                lookup, self.speculative_tokens, rows, [], entry, output, cancel
            )
        else:
            self._decode_plain(rows[0], entry, output, cancel, temperature)
        result.text = output.text
        result.new_tokens = len(output.generated)
        result.decode_ms = (time.perf_counter() - decode_started) * 1000
        self._prefix_cache.put(entry)
        return result

    def _decode_plain(
        self,
        logits: Any,
        entry: CacheEntry,
        output: _Output,
        cancel: CancelToken,
        temperature: float,
        forced_text: str = "",
        unfinished_word: bool = False,
    ) -> None:
        """One forward pass per token; the first ones spell `forced_text` when it is given."""
        while len(output.generated) < output.max_new_tokens:
            if cancel.cancelled:
                output.result.stop_reason = "cancelled"
                return
            if len(output.text) < len(forced_text):
                remaining = forced_text[len(output.text) :]
                allowed = self.vocab_index().allowed(remaining, unfinished_word)
                if not allowed:  # no token spells it: nothing can be suggested
                    output.result.stop_reason = "stop"
                    return
                token, logprob = best_allowed(logits.float().numpy(), allowed)
            else:
                token, logprob = self._next_token(logits, temperature)
            if output.add(token, logprob):
                return
            logits = self._forward([token], entry.cache)
            entry.tokens.append(token)
            output.result.decode_passes += 1

    def _decode_speculative(
        self,
        drafter: Drafter,
        draft_tokens: int,
        rows: list[Any],
        draft: list[int],
        entry: CacheEntry,
        output: _Output,
        cancel: CancelToken,
        *,
        adapt: bool = False,
    ) -> None:
        """Greedy decoding that checks up to `draft_tokens` of `drafter`'s tokens per forward pass.

        Each pass feeds the last token and a draft; its logits at position i give the greedy token
        after the draft's first i tokens. Those tokens are taken in order, exactly as the plain loop
        takes its tokens (cancellation, EOS, stop rule and token limit checked before and after
        each), until one differs from the draft: that one is the model's own, not yet in the
        cache, and the cache is cropped back to the last agreed token. `rows` and `draft` are the
        prompt's last pass: its last row, and the rows after `draft` when it checked one.

        With `adapt`, a draft after a mismatch is twice as long as the agreed part of the last one
        (at least `MIN_EDIT_DRAFT_TOKENS`), and back to `draft_tokens` once a draft is taken whole.
        """
        if output.max_new_tokens <= 0:
            return
        result = output.result
        length = draft_tokens
        while True:
            accepted, fresh = 0, None
            for index, row in enumerate(rows):
                if cancel.cancelled:
                    result.stop_reason = "cancelled"
                    break
                token, logprob = self._next_token(row, 0.0)
                before = len(output.generated)
                done = output.add(token, logprob)
                matched = index < len(draft) and token == draft[index]
                if matched and len(output.generated) > before:
                    accepted += 1  # its key and value are already in the cache
                if done:
                    break
                drafter.append(token)
                if not matched:
                    fresh = token
                    break
            if draft:
                result.draft_accepted += accepted
                # The cache holds the fed tokens; keep the last token and the agreed draft.
                keep = len(entry.tokens) - len(draft) + accepted
                crop_cache(entry.cache, keep)
                del entry.tokens[keep:]
                if adapt:
                    whole = accepted == len(draft)
                    length = draft_tokens if whole else max(MIN_EDIT_DRAFT_TOKENS, 2 * accepted)
                    length = min(length, draft_tokens)
            if fresh is None:
                return
            remaining = output.max_new_tokens - len(output.generated)
            draft = drafter.propose(min(length, remaining))
            fed = [fresh, *draft]
            rows = self._forward_rows(fed, entry.cache)
            entry.tokens.extend(fed)
            result.decode_passes += 1
            if draft:
                result.verify_steps += 1
                result.draft_tokens += len(draft)

    def _decode(self, anchor: list[int], generated: list[int]) -> str:
        """Text of `generated` as it continues the prompt.

        SentencePiece tokenizers drop the leading space of the first token of a decoded sequence;
        decoding after the prompt's last token and removing that token's text keeps it.
        """
        options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
        head = self.tokenizer.decode(anchor, **options)
        return str(self.tokenizer.decode(anchor + generated, **options))[len(head) :]

    def _cut(self, text: str, stop: StopRule) -> int | None:
        """Where to end `text`: at a stop string of the template, or where the stop rule says."""
        cuts = [index for token in self._stop_strings if (index := text.find(token)) >= 0]
        # An incomplete UTF-8 sequence decodes to U+FFFD; judge the text once it is complete.
        rule = stop(text) if not text.endswith("\ufffd") else None
        if rule is not None:
            cuts.append(rule)
        return min(cuts) if cuts else None

    def close(self) -> None:
        """Drop the model and the KV caches."""
        self._prefix_cache.clear()
        self.model = None
