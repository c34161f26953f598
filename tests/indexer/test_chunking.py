"""Chunking real code: definitions stay whole when they fit, nothing exceeds the token limit."""

from __future__ import annotations

import ast
import hashlib
import itertools
from pathlib import Path

import pytest

from indexer.chunking import Chunker, EstimatedCounter, WordPieceCounter, split_lines
from indexer.embed import bundled_model_path
from indexer.types import Chunk
from tests.indexer.conftest import STDLIB

JS_SOURCE = """\
import { readFile } from "node:fs/promises";

// Parses a key=value configuration file into an object.
export async function loadConfig(path) {
  const text = await readFile(path, "utf8");
  const entries = text.split("\\n").filter((line) => line.includes("="));
  return Object.fromEntries(entries.map((line) => line.split("=", 2)));
}

export class Cache {
  constructor(limit) {
    this.limit = limit;
    this.items = new Map();
  }

  get(key) {
    const value = this.items.get(key);
    if (value !== undefined) {
      this.items.delete(key);
      this.items.set(key, value);
    }
    return value;
  }
}

const debounce = (fn, ms) => {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
};
"""

GO_SOURCE = """\
package store

import "sync"

// Store is a map guarded by a mutex.
type Store struct {
	mu    sync.Mutex
	items map[string]int
}

// Get returns the value for key.
func (s *Store) Get(key string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.items[key]
	return v, ok
}

// New makes an empty store.
func New() *Store {
	return &Store{items: map[string]int{}}
}
"""

RUST_SOURCE = """\
use std::collections::HashMap;

/// Counts words in a text.
pub fn word_counts(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    counts
}

pub struct Point {
    pub x: f64,
    pub y: f64,
}

impl Point {
    pub fn norm(&self) -> f64 {
        (self.x * self.x + self.y * self.y).sqrt()
    }
}

pub enum Shape {
    Circle(f64),
    Square(f64),
}
"""


@pytest.fixture(scope="module")
def counter() -> WordPieceCounter:
    return WordPieceCounter(bundled_model_path() / "tokenizer.json")


def lines_covered(chunks: list[Chunk]) -> set[int]:
    return {line for c in chunks for line in range(c.start_line, c.end_line)}


def check_invariants(chunks: list[Chunk], text: str, counter: WordPieceCounter, limit: int) -> None:
    lines = split_lines(text)
    nonblank = {i for i, line in enumerate(lines) if line.strip()}
    assert nonblank <= lines_covered(chunks)
    assert max(counter.count([c.text for c in chunks])) <= limit
    for chunk in chunks:
        assert chunk.id == hashlib.sha256(chunk.text.encode()).hexdigest()
        if chunk.end_line - chunk.start_line > 1 or chunk.text.endswith("\n"):
            assert chunk.text == "".join(lines[chunk.start_line : chunk.end_line])


@pytest.mark.parametrize("module", ["textwrap.py", "heapq.py", "json/decoder.py", "shlex.py"])
def test_python_stdlib_chunks_follow_definitions(module: str, counter: WordPieceCounter) -> None:
    text = (STDLIB / module).read_text()
    chunker = Chunker(counter, max_tokens=254)
    chunks = chunker.chunk(module, text)
    check_invariants(chunks, text, counter, 254)
    assert all(c.language == "python" for c in chunks)
    # Python's own parser is the oracle: every top-level definition is listed in the chunk
    # holding its first line, and one that fits the limit is never cut.
    lines = split_lines(text)
    fitting = 0
    for node in ast.parse(text).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        last = node.end_lineno or node.lineno
        holder = next(c for c in chunks if c.contains(node.lineno - 1))
        assert node.name in [sym.name for sym in holder.symbols]
        if counter.count(["".join(lines[first:last])])[0] <= 254:
            fitting += 1
            assert holder.start_line <= first and holder.end_line >= last, node.name
    assert fitting > 0


@pytest.mark.parametrize(
    ("path", "source", "symbols", "starts"),
    [
        pytest.param(
            "config.js",
            JS_SOURCE,
            ["loadConfig", "Cache", "Cache.constructor", "Cache.get", "debounce"],
            [0, 2, 9, 25],
            id="javascript",
        ),
        pytest.param("store.go", GO_SOURCE, ["Store", "Get", "New"], [0, 4, 10, 18], id="go"),
        pytest.param(
            "geometry.rs",
            RUST_SOURCE,
            ["word_counts", "Point", "Point.norm", "Shape"],
            [0, 2, 11, 16, 22],
            id="rust",
        ),
    ],
)
def test_other_languages(
    path: str, source: str, symbols: list[str], starts: list[int], counter: WordPieceCounter
) -> None:
    # min_tokens=0: every definition starts its own chunk, with the comments above it.
    chunks = Chunker(counter, max_tokens=254, min_tokens=0).chunk(path, source)
    check_invariants(chunks, source, counter, 254)
    assert [s.qualified_name for c in chunks for s in c.symbols] == symbols
    assert [c.start_line for c in chunks] == starts


def test_small_neighbours_share_a_chunk(counter: WordPieceCounter) -> None:
    merged = Chunker(counter, max_tokens=254, min_tokens=200).chunk("store.go", GO_SOURCE)
    assert len(merged) == 1
    assert [s.name for s in merged[0].symbols] == ["Store", "Get", "New"]


def test_large_definition_is_split_within_the_limit(counter: WordPieceCounter) -> None:
    body = "".join(f"    total += compute_value(item_{i}, weight={i})\n" for i in range(300))
    text = f"def accumulate(items):\n    total = 0\n{body}    return total\n"
    chunks = Chunker(counter, max_tokens=120).chunk("big.py", text)
    check_invariants(chunks, text, counter, 120)
    assert len(chunks) > 10
    assert chunks[0].start_line == 0 and chunks[0].symbols[0].name == "accumulate"
    assert chunks[0].end_line > 2  # the header packs with the start of the body


def test_text_files_use_overlapping_windows(counter: WordPieceCounter) -> None:
    text = "".join(f"Line {i} of the notes about the release process.\n" for i in range(120))
    chunks = Chunker(counter, max_tokens=100, overlap_lines=3).chunk("NOTES.txt", text)
    check_invariants(chunks, text, counter, 100)
    assert chunks[0].language == "txt"
    for before, after in itertools.pairwise(chunks):
        assert after.start_line == before.end_line - 3


@pytest.mark.parametrize("counter_kind", ["wordpiece", "estimate"])
def test_one_huge_line_is_cut_at_token_limits(counter_kind: str, counter: WordPieceCounter) -> None:
    used = counter if counter_kind == "wordpiece" else EstimatedCounter()
    text = "var a=" + ",".join(f"x{i}:{i}" for i in range(5000)) + ";\n"
    chunks = Chunker(used, max_tokens=200).chunk("bundle.js", text)
    assert len(chunks) > 5
    assert "".join(c.text for c in chunks) == text
    assert max(counter.count([c.text for c in chunks])) <= (200 if used is counter else 10_000)
    assert max(used.count([c.text for c in chunks])) <= 200


def test_estimate_is_an_upper_bound_on_real_code(counter: WordPieceCounter) -> None:
    texts = [(STDLIB / name).read_text() for name in ("textwrap.py", "bisect.py", "glob.py")]
    for text in texts:
        assert EstimatedCounter().count([text])[0] >= counter.count([text])[0]


@pytest.mark.parametrize("text", ["", "\n\n  \n", "x"])
def test_degenerate_files(text: str, counter: WordPieceCounter, tmp_path: Path) -> None:
    chunks = Chunker(counter).chunk("a.py", text)
    assert [c.text for c in chunks] == ([text] if text.strip() else [])
