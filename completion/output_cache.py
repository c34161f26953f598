"""A model runner that remembers its outputs by prompt hash.

The bundled model decodes a few tokens a second on a CPU. Evaluations and the replay simulator ask
for the same prompts run after run, so each prompt is run once and its output kept on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from completion.runners.base import ModelRunner, RunnerCapabilities, SplitPromptRunner
from completion.types import CancelToken, Generation, StopRule


class CachedRunner:
    """A model runner that answers a prompt it has seen before from a file, by prompt hash.

    Entries are appended to a JSON-lines file
    keyed by SHA-256 of (model id, generation parameters, prompt, and how the runner reads a
    prompt where that changes its text); a cut last line (a killed run) is ignored.
    """

    def __init__(self, runner: ModelRunner, path: Path) -> None:
        self.runner = runner
        self.model_id = runner.model_id  # part of every key; an adapter swapped here changes it
        # The served adapter's content (its files' checksums), also in every key: two adapters
        # may carry the same version name (two trainings in two temporary registries).
        self.adapter_content = ""
        self.family = runner.family
        self.capabilities = RunnerCapabilities.of(runner)
        # Token healing is asked of the runner only when it can follow it.
        self.forces_text = self.capabilities.healing is not None
        # How the runner reads a prompt, where that changes its text (the fast engine's split).
        self.variant = runner.output_variant if isinstance(runner, SplitPromptRunner) else ""
        self.path = path
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._entries: dict[str, Generation] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    self._entries[entry["key"]] = Generation(
                        text=str(entry["text"]),
                        token_logprobs=[float(x) for x in entry["token_logprobs"]],
                        prompt_tokens=int(entry["prompt_tokens"]),
                        new_tokens=int(entry["new_tokens"]),
                        stop_reason=entry["stop_reason"],
                        # The time the model took when it ran, for latency reports.
                        prefill_ms=float(entry.get("prefill_ms", 0.0)),
                        decode_ms=float(entry.get("decode_ms", 0.0)),
                    )
                except (ValueError, KeyError, TypeError):
                    continue

    def swap_adapter(self, adapter: Path | None) -> None:
        """Serve `adapter` (the runner's `swap_adapter`); the model id, and so every key, follows,
        so the outputs of base and adapted models are kept apart."""
        from completion.adapters import read_manifest

        adapters = self.capabilities.adapters
        if adapters is None:
            raise TypeError(f"{type(self.runner).__name__} cannot serve an adapter")
        adapters.swap_adapter(adapter)
        self.model_id = self.runner.model_id
        files = read_manifest(adapter)["files"] if adapter is not None else None
        self.adapter_content = json.dumps(files, sort_keys=True) if files else ""

    def count_tokens(self, text: str) -> int:
        return self.runner.count_tokens(text)

    def _key(
        self, prompt: str, max_new_tokens: int, temperature: float, forced: str, unfinished: bool
    ) -> str:
        parts: list[object] = [self.model_id, max_new_tokens, temperature, prompt]
        if forced:  # keys of unhealed prompts stay as they were
            parts.append(forced)
        if unfinished:
            parts.append("unfinished word")
        if self.variant:
            parts.append(self.variant)
        if self.adapter_content:
            parts.append(self.adapter_content)
        material = json.dumps(parts)
        return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()

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
        key = self._key(prompt, max_new_tokens, temperature, forced_text, unfinished_word)
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            return Generation(
                text=entry.text,
                token_logprobs=list(entry.token_logprobs),
                prompt_tokens=entry.prompt_tokens,
                new_tokens=entry.new_tokens,
                stop_reason=entry.stop_reason,
                prefill_ms=entry.prefill_ms,
                decode_ms=entry.decode_ms,
            )
        self.misses += 1
        forced: dict[str, object] = {}
        if forced_text:
            forced = {"forced_text": forced_text, "unfinished_word": unfinished_word}
        generation = self.runner.generate(
            prompt,
            max_new_tokens=max_new_tokens,
            stop=stop,
            cancel=cancel,
            temperature=temperature,
            **forced,
        )
        if generation.stop_reason == "cancelled":
            return generation
        record = {
            "key": key,
            "text": generation.text,
            "token_logprobs": generation.token_logprobs,
            "prompt_tokens": generation.prompt_tokens,
            "new_tokens": generation.new_tokens,
            "stop_reason": generation.stop_reason,
            "prefill_ms": generation.prefill_ms,
            "decode_ms": generation.decode_ms,
        }
        with self._lock:
            self._entries[key] = generation
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        return generation

    def close(self) -> None:
        self.runner.close()
