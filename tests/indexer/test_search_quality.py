"""Search quality with the real bundled model (all-MiniLM-L6-v2) on real standard-library code.

Each query describes one function or class in words; a hit is the chunk that defines it (its
symbols name it) among the top five results. The rate is printed and recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.service import WorkspaceIndex
from tests.indexer.conftest import quiet_settings

QUERIES: list[tuple[str, str, tuple[str, ...]]] = [
    ("wrap a paragraph of text into lines of a maximum width", "textwrap.py", ("wrap", "fill")),
    ("remove common leading whitespace from every line", "textwrap.py", ("dedent",)),
    ("add a prefix to the beginning of selected lines", "textwrap.py", ("indent",)),
    ("truncate text to fit a width and add a placeholder", "textwrap.py", ("shorten",)),
    ("push an item onto a priority queue keeping the heap invariant", "heapq.py", ("heappush",)),
    ("find the n largest elements of a dataset", "heapq.py", ("nlargest",)),
    ("merge several sorted inputs into one sorted iterator", "heapq.py", ("merge",)),
    ("transform a list into a heap in place in linear time", "heapq.py", ("heapify",)),
    (
        "locate the insertion point for a value in a sorted list",
        "bisect.py",
        ("bisect_left", "bisect_right"),
    ),
    (
        "insert an item into a sorted list and keep it sorted",
        "bisect.py",
        ("insort_left", "insort_right"),
    ),
    ("test whether a filename matches a shell wildcard pattern", "fnmatch.py", ("fnmatch",)),
    ("translate a shell pattern to a regular expression", "fnmatch.py", ("translate",)),
    ("split a command line string into arguments like a shell", "shlex.py", ("split",)),
    ("quote a string so it is safe to use in a shell command", "shlex.py", ("quote",)),
    ("join a list of arguments into a shell-escaped string", "shlex.py", ("join",)),
    ("encode bytes with standard base64", "base64.py", ("b64encode", "standard_b64encode")),
    ("decode a base32 encoded string", "base64.py", ("b32decode", "_b32decode")),
    ("Ascii85 encode bytes", "base64.py", ("a85encode",)),
    ("convert an RGB colour to hue saturation value", "colorsys.py", ("rgb_to_hsv",)),
    ("convert hue lightness saturation to red green blue", "colorsys.py", ("hls_to_rgb",)),
    ("find all path names matching a pattern, recursively", "glob.py", ("glob", "iglob")),
    ("escape the special characters of a glob pattern", "glob.py", ("escape",)),
    ("serialize a Python object to a JSON formatted string", "json/__init__.py", ("dumps",)),
    ("read and parse a JSON document from a file object", "json/__init__.py", ("load",)),
    (
        "error raised when JSON decoding fails, with line and column",
        "json/decoder.py",
        ("JSONDecodeError",),
    ),
    (
        "escape a Python string as a JSON string literal",
        "json/encoder.py",
        ("py_encode_basestring", "py_encode_basestring_ascii"),
    ),
]


def is_hit(hit_path: str, hit_symbols: tuple[str, ...], path: str, names: tuple[str, ...]) -> bool:
    defined = {symbol.rsplit(".", 1)[-1] for symbol in hit_symbols}
    return hit_path == path and bool(defined & set(names))


@pytest.mark.slow
def test_natural_language_queries_find_the_defining_chunk(
    stdlib_search_tree: Path, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    index = WorkspaceIndex(stdlib_search_tree, quiet_settings(), tmp_path / "cache")
    index.start()
    try:
        assert index.wait_idle(900), index.status()
        assert index.status()["state"] == "ready"
        misses = []
        for query, path, names in QUERIES:
            hits = index.search(query, 5)
            if not any(is_hit(h.path, h.symbols, path, names) for h in hits):
                misses.append((query, [(h.path, h.symbols) for h in hits]))
    finally:
        index.close()
    rate = 1 - len(misses) / len(QUERIES)
    record_property("top5_hit_rate", rate)
    print(f"top-5 hit rate {rate:.2f} on {len(QUERIES)} queries; misses: {misses}")
    assert rate >= 0.8, misses
