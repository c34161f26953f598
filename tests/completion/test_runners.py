"""Choosing a runner from settings, and the KV-prefix cache's bookkeeping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from completion.runners import load_runner
from completion.runners.http import HttpRunner
from completion.runners.prefix_cache import CacheEntry, PrefixCache, common_prefix_length
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings


class FakeKV:
    """Stands in for a transformers cache: only its length matters to PrefixCache."""

    def __init__(self, length: int) -> None:
        self.length = length

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, value: int) -> None:
        assert value < 0, "crop is always called with the number of tokens to remove, negated"
        self.length += value


def entry(tokens: list[int]) -> CacheEntry:
    return CacheEntry(list(tokens), FakeKV(len(tokens)))


@pytest.mark.parametrize(
    ("a", "b", "length"),
    [
        pytest.param([], [1], 0, id="empty"),
        pytest.param([1, 2, 3], [1, 2, 3], 3, id="equal"),
        pytest.param([1, 2, 3], [1, 2], 2, id="shorter"),
        pytest.param([1, 2, 3], [1, 9, 3], 1, id="differs"),
    ],
)
def test_common_prefix_length(a: list[int], b: list[int], length: int) -> None:
    assert common_prefix_length(a, b) == length


def test_take_picks_longest_match_and_crops() -> None:
    cache = PrefixCache(max_entries=2)
    cache.put(entry([1, 2, 3, 4, 5]))
    cache.put(entry([7, 8, 9]))
    taken, reused = cache.take([1, 2, 3, 9, 9])
    assert taken is not None and reused == 3
    assert taken.tokens == [1, 2, 3] and taken.cache.get_seq_length() == 3
    assert len(cache) == 1, "an entry in use is not shared"


def test_take_leaves_one_token_to_prefill() -> None:
    cache = PrefixCache()
    cache.put(entry([1, 2, 3]))
    taken, reused = cache.take([1, 2, 3])
    assert reused == 2 and taken is not None and taken.cache.get_seq_length() == 2


def test_no_match() -> None:
    cache = PrefixCache()
    cache.put(entry([5, 6]))
    assert cache.take([1, 2]) == (None, 0)
    assert len(cache) == 1


def test_eviction_and_token_cap() -> None:
    cache = PrefixCache(max_entries=2, max_tokens=4)
    cache.put(entry([1, 2, 3, 4, 5]))
    assert len(cache) == 0, "over the token cap: not kept"
    for first in (1, 2, 3):
        cache.put(entry([first, 0]))
    assert len(cache) == 2
    assert cache.take([1, 0, 0]) == (None, 0), "the oldest entry was evicted"


def test_disabled_cache_keeps_nothing() -> None:
    cache = PrefixCache(max_entries=0)
    cache.put(entry([1, 2]))
    assert len(cache) == 0


def test_load_runner_local(tiny_model_path: Path, tmp_path: Path) -> None:
    settings = CompletionSettings(
        model=str(tiny_model_path), cache=False, threads=1, engine="torch"
    )
    runner: Any = load_runner(settings, tmp_path)
    assert isinstance(runner, TorchRunner)
    assert runner.family == "qwen"
    assert runner.dtype == "float32"
    assert runner.speculative is False
    runner.close()


def test_load_runner_passes_speculative_settings(tiny_model_path: Path, tmp_path: Path) -> None:
    settings = CompletionSettings.model_validate(
        {
            "model": str(tiny_model_path),
            "engine": "torch",
            "speculative": True,
            "speculativeTokens": 5,
        }
    )
    runner: Any = load_runner(settings, tmp_path)
    assert (runner.speculative, runner.speculative_tokens) == (True, 5)
    runner.close()


def test_load_runner_http_with_template_override(tmp_path: Path) -> None:
    settings = CompletionSettings(
        runner="http",
        http_url="http://127.0.0.1:9/v1/",
        http_model="anything",
        fim_template="deepseek",
        http_timeout_s=3,
    )
    runner: Any = load_runner(settings, tmp_path)
    assert isinstance(runner, HttpRunner)
    assert runner.family == "deepseek"
    assert runner.timeout_s == 3
    assert runner.base_url == "http://127.0.0.1:9/v1"
    runner.close()
