"""A model runner whose answers the test chooses, for tests of everything around the model.

Tests of the protocol, the editors and telemetry must not depend on what a model happens to
generate: a model's greedy output changes with the CPU's floating-point kernels. `ScriptedModel`
implements the runner interface (`completion.runners.base.ModelRunner`) and answers each prompt with
the text of the first rule whose key the code before the cursor ends with, emitted token by token
so that stop rules, cancellation and streaming behave as with a real model.

Served over HTTP by `tests.support.completion_server`, it stands in for a model in a language
server started as a subprocess (`completion.runner = "http"`).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from completion.types import CancelToken, Generation, StopRule

# Rough code tokens: runs of word characters, runs of spaces, a newline, or one other character.
_TOKEN = re.compile(r"\w+| +|\n|[^\w\s]")
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_SUFFIX = "<|fim_suffix|>"


def code_before_cursor(prompt: str) -> str:
    """The file's text before the cursor in a Qwen-style FIM prompt (the whole prompt otherwise)."""
    start = prompt.rfind(_FIM_PREFIX)
    if start < 0:
        return prompt
    start += len(_FIM_PREFIX)
    end = prompt.find(_FIM_SUFFIX, start)
    return prompt[start:] if end < 0 else prompt[start:end]


def split_tokens(text: str) -> list[str]:
    """`text` as the pieces the scripted model emits one per step (they join back to `text`)."""
    return _TOKEN.findall(text)


@dataclass
class ScriptedModel:
    """Answers `rules[key]` when the code before the cursor ends with `key`, else `default`.

    `token_delay_s` makes each step take that long (for cancellation tests); `logprob` is every
    token's log-probability. `prompts` records what was asked, in order.
    """

    rules: dict[str, str] = field(default_factory=dict)
    default: str = ""
    logprob: float = -0.1
    token_delay_s: float = 0.0
    model_id: str = "scripted"
    family: str = "qwen"
    prompts: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def answer_for(self, prompt: str) -> str:
        """The scripted text for `prompt`."""
        before = code_before_cursor(prompt)
        for key, text in self.rules.items():
            if before.endswith(key):
                return text
        return self.default

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
    ) -> Generation:
        with self._lock:
            self.prompts.append(prompt)
        result = Generation(text="", prompt_tokens=self.count_tokens(prompt))
        started = time.perf_counter()
        tokens = split_tokens(self.answer_for(prompt))
        for token in tokens[:max_new_tokens]:
            if cancel.cancelled:
                result.stop_reason = "cancelled"
                return result
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            result.text += token
            result.token_logprobs.append(self.logprob)
            result.new_tokens += 1
            cut = stop(result.text)
            if cut is not None:
                result.text = result.text[:cut]
                result.stop_reason = "stop"
                break
        else:
            result.stop_reason = "length" if len(tokens) > max_new_tokens else "eos"
        result.decode_ms = (time.perf_counter() - started) * 1000
        return result

    def close(self) -> None:
        pass
