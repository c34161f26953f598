"""Fill-in-the-middle training examples cut from a workspace's own files, streamed.

The files are the ones the index would read (its deny list, `.gitignore` and the other ignore
rules, binary, size and secret-content filters all apply), less a held-out share kept for
evaluation. Cursors sit where a user completes: part-way into a line (the rest of the line is the
middle), right after an opening bracket (a call's arguments), or at the indent of a statement
inside a block (the rest of the block). The stream is a pure function of the seed: example `k`
is the same in every run, which is what lets a resumed run skip what it already trained on.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.languages import EXTENSIONS
from indexer.scan import Scanner, StatCache, read_file

MAX_FILE_BYTES = 300_000
HELD_OUT_SHARE = 0.2
CURSORS_PER_FILE = 8
MIN_LINE_CHARS = 8


@dataclass(frozen=True)
class FimExample:
    """Text before the cursor, the text the model should write there, and the text after it."""

    path: str  # relative to the workspace root
    prefix: str
    middle: str
    suffix: str
    kind: str  # "line", "call" or "block"
    advantage: float = 1.0  # feedback examples: the reward's advantage; code examples: 1
    weight: float = 1.0  # feedback examples: the clipped inverse propensity; code examples: 1
    source: str = "code"  # "code" or "feedback"
    # Next-edit examples: the text the middle rewrites (the window as it is, and the end
    # marker), so that the trainer can tell the tokens an edit changes from those it copies.
    draft: str = ""


def workspace_files(root: Path, exclude: Sequence[str] = ()) -> list[str]:
    """Code files of `root` that the index would read, relative and sorted."""
    result = Scanner(root, exclude=exclude).scan(StatCache())
    return sorted(rel for rel in result.changed if Path(rel).suffix in EXTENSIONS)


def is_held_out(rel_path: str, share: float = HELD_OUT_SHARE) -> bool:
    """Whether a file is kept for evaluation: a hash of its path, so the split is stable as files
    come and go (a file never moves from the held-out side to the training side)."""
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def split_files(files: Sequence[str], share: float = HELD_OUT_SHARE) -> tuple[list[str], list[str]]:
    """(training files, held-out files)."""
    train = [f for f in files if not is_held_out(f, share)]
    held = [f for f in files if is_held_out(f, share)]
    return train, held


def read_text(root: Path, rel_path: str) -> str | None:
    """A file's text when the index would read it (not binary, too large or holding a secret)."""
    content = read_file(root, rel_path, MAX_FILE_BYTES)
    if content.data is None:
        return None
    try:
        return content.data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _block_end(lines: list[str], start: int) -> int:
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def cut_examples(path: str, text: str, count: int, rng: random.Random) -> list[FimExample]:
    """Up to `count` examples from one file, at cursors drawn with `rng`."""
    lines = text.splitlines(keepends=True)
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line)
    candidates = [
        number
        for number, line in enumerate(lines)
        if len(stripped := line.strip()) >= MIN_LINE_CHARS
        and not stripped.startswith(("#", '"', "'", "//", "*"))
    ]
    examples = []
    for number in rng.sample(candidates, min(count, len(candidates))):
        line = lines[number]
        content = line.rstrip("\r\n")
        indent = len(content) - len(content.lstrip())
        draw = rng.random()
        if draw < 0.25 and indent > 0 and number + 1 < len(lines):
            end = _block_end(lines, number)
            column, kind = indent, "block"
            middle = "".join(lines[number:end])[column:].rstrip("\n")
            stop = starts[number] + column + len(middle)
        else:
            brackets = [i + 1 for i, c in enumerate(content) if c == "(" and i + 1 < len(content)]
            if draw < 0.5 and brackets:
                column, kind = rng.choice(brackets), "call"
            else:
                column = indent + rng.randrange(0, max(1, (len(content) - indent) // 2 + 1))
                kind = "line"
            middle = content[column:]
            stop = starts[number] + len(content)
        cursor = starts[number] + column
        if not middle.strip():
            continue
        examples.append(FimExample(path, text[:cursor], middle, text[stop:], kind))
    return examples


def seeded_random(seed: int, *parts: object) -> random.Random:
    """A random generator that is a pure function of the seed and `parts`."""
    key = "\x00".join(str(part) for part in (seed, *parts)).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def stream_code_examples(
    root: Path, files: Sequence[str], seed: int, per_file: int = CURSORS_PER_FILE
) -> Iterator[FimExample]:
    """Examples from `files`, epoch after epoch, read one file at a time (never all at once).

    Each epoch visits the files in a seeded order and draws fresh cursors in each. Files that
    cannot be read are skipped; if none can, the stream ends.
    """
    epoch = 0
    while True:
        order = list(files)
        seeded_random(seed, "order", epoch).shuffle(order)
        produced = 0
        for rel in order:
            text = read_text(root, rel)
            if text is None:
                continue
            for example in cut_examples(rel, text, per_file, seeded_random(seed, epoch, rel)):
                produced += 1
                yield example
        if produced == 0:
            return
        epoch += 1
