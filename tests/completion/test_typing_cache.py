"""The typing-through cache: hits while the user types what is on screen, misses otherwise."""

from __future__ import annotations

import pytest

from completion.cache import TypingThroughCache
from completion.types import CompletionRequest

PREFIX = "def area(width, height):\n    return "
SUFFIX = "\n\nprint(area(2, 3))\n"
SUGGESTION = "width * height"


def request(prefix: str = PREFIX, suffix: str = SUFFIX) -> CompletionRequest:
    return CompletionRequest(prefix=prefix, suffix=suffix, language="python")


@pytest.fixture
def cache() -> TypingThroughCache:
    filled = TypingThroughCache()
    filled.store(request(), SUGGESTION)
    return filled


@pytest.mark.parametrize(
    ("typed", "rest"),
    [
        pytest.param("", SUGGESTION, id="same-position"),
        pytest.param("w", "idth * height", id="one-char"),
        pytest.param("width *", " height", id="several-words"),
        pytest.param("width * heigh", "t", id="last-char-left"),
    ],
)
def test_typing_through_the_suggestion_hits(
    cache: TypingThroughCache, typed: str, rest: str
) -> None:
    assert cache.lookup(request(PREFIX + typed)) == rest
    assert cache.hits == 1


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(request(PREFIX + "x"), id="diverging-character"),
        pytest.param(request(PREFIX + SUGGESTION), id="typed-it-all"),
        pytest.param(request(PREFIX[:-1]), id="deleted-a-character"),
        pytest.param(
            request(
                PREFIX.replace("width", "w"),
            ),
            id="edit-earlier-in-prefix",
        ),
        pytest.param(request(PREFIX + "w", SUFFIX + "# more\n"), id="edit-in-suffix"),
        pytest.param(request("import os\n" + PREFIX + "w"), id="line-added-above"),
    ],
)
def test_any_other_edit_misses(cache: TypingThroughCache, changed: CompletionRequest) -> None:
    assert cache.lookup(changed) is None
    assert cache.misses == 1


def test_disabled_cache_never_answers() -> None:
    cache = TypingThroughCache(enabled=False)
    cache.store(request(), SUGGESTION)
    assert cache.lookup(request(PREFIX + "w")) is None


def test_bounded_least_recently_used() -> None:
    cache = TypingThroughCache(max_entries=3)
    for i in range(5):
        cache.store(request(f"x{i} = "), f"value_{i}")
    assert cache.lookup(request("x0 = ")) is None  # evicted
    assert cache.lookup(request("x4 = v")) == "alue_4"


def test_clear_forgets_every_suggestion() -> None:
    cache = TypingThroughCache()
    request = CompletionRequest(prefix="x = compu", suffix="\n", language="python")
    cache.store(request, "te()")
    assert cache.find(request) is not None
    cache.clear()
    assert cache.find(request) is None


def test_the_version_that_wrote_it_is_kept_while_typing_through() -> None:
    filled = TypingThroughCache()
    filled.store(request(), SUGGESTION, model_version="v0004")
    typed = filled.find(request(PREFIX + "wid"))
    assert typed is not None and typed.text == "th * height"
    assert typed.generation is None  # its log-probabilities describe the whole suggestion
    assert typed.model_version == "v0004"
