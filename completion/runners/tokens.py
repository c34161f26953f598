"""What the fast runners share about tokens: the stop tokens and FIM family a model's files name,
the searchable vocabulary for token healing, and the stream that turns generated tokens into
text, cut by the stop rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from completion.fim import UnknownFamily, detect_family
from completion.healing import VocabIndex, token_texts
from completion.types import StopRule


def family_of(tokenizer: Any, name: str) -> str:
    """The FIM family of a model from its tokenizer's special tokens and its name."""
    specials = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
    try:
        return detect_family(specials, name)
    except UnknownFamily:
        raise UnknownFamily(
            f"cannot tell the fill-in-the-middle format of {name}: set completion.fimTemplate"
        ) from None


def stop_ids(path: Path, tokenizer: Any, stop_strings: tuple[str, ...]) -> set[int]:
    """Token ids that end a generation: the model's EOS ids and the template's stop tokens."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            config = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        eos = config.get("eos_token_id")
        for value in eos if isinstance(eos, list) else [eos]:
            if isinstance(value, int):
                ids.add(value)
    for token in stop_strings:
        found = tokenizer.token_to_id(token)
        if found is not None:
            ids.add(found)
    return ids


def vocab_index(tokenizer: Any, excluded: set[int] | frozenset[int]) -> VocabIndex:
    """The decoded text of every token (`completion.healing`), without special and stop tokens."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    decoded = tokenizer.decode_batch([[token] for token in range(size)], skip_special_tokens=False)
    raw = [tokenizer.id_to_token(token) or "" for token in range(size)]
    added = set(tokenizer.get_added_tokens_decoder())
    return VocabIndex(token_texts(decoded, raw), added | set(excluded))


def cut_at(text: str, stop_strings: tuple[str, ...], stop: StopRule) -> int | None:
    """Where to end `text`: at a stop string of the template, or where the stop rule says."""
    cuts = [index for token in stop_strings if (index := text.find(token)) >= 0]
    # An incomplete UTF-8 sequence decodes to U+FFFD; judge the text once it is complete.
    rule = stop(text) if not text.endswith("\ufffd") else None
    if rule is not None:
        cuts.append(rule)
    return min(cuts) if cuts else None


class TokenStream:
    """The text of the tokens generated so far, cut by the stop rule, with their log-probs.

    It holds the tokenizer and the stop data, never the runner: the engine's worker thread may
    drop the last reference to the callback that holds a stream, and a runner released there
    would join that thread from itself.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop_ids: frozenset[int],
        stop_strings: tuple[str, ...],
        prompt_ids: list[int],
        stop: StopRule,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        self.anchor = prompt_ids[-1:]
        self.head = self._decode(self.anchor)
        self.stop = stop
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.ends: list[int] = []
        self.text = ""
        self.reason: Literal["stop", "length", "eos"] = "length"

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def add(self, token_id: int, logprob: float) -> bool:
        """Take one generated token; True when generation should stop here."""
        if token_id in self.stop_ids:
            self.reason = "eos"
            return True
        self.ids.append(token_id)
        self.logprobs.append(logprob)
        self.text = self._decode(self.anchor + self.ids)[len(self.head) :]
        self.ends.append(len(self.text))
        cut = cut_at(self.text, self.stop_strings, self.stop)
        if cut is not None:
            self.text = self.text[:cut]
            kept = next((i + 1 for i, end in enumerate(self.ends) if end >= cut), len(self.ends))
            del self.logprobs[kept if cut > 0 else 0 :]
            self.reason = "stop"
            return True
        return False
