"""The Merkle tree: hashes change exactly when content changes; diffs are exact."""

from __future__ import annotations

import hashlib
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from indexer.merkle import MerkleTree, directory_hash
from indexer.scan import leaf_hash

NAMES = st.sampled_from(["a", "b", "c", "é", "a b", "z.py"])
PATHS = st.lists(NAMES, min_size=1, max_size=4).map("/".join)
CONTENTS = st.binary(max_size=8)


def tree_of(files: dict[str, bytes]) -> MerkleTree:
    return MerkleTree.from_leaves({path: leaf_hash(data) for path, data in files.items()})


def consistent(files: dict[str, bytes]) -> dict[str, bytes]:
    """Drop paths that would need a file and a directory of the same name."""
    kept: dict[str, bytes] = {}
    for path in sorted(files, key=len):
        prefixes = {"/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)}
        if prefixes & kept.keys() or any(k.startswith(path + "/") for k in kept):
            continue
        kept[path] = files[path]
    return kept


def clashes(files: dict[str, bytes], path: str) -> bool:
    return any(other.startswith(path + "/") or path.startswith(other + "/") for other in files)


def test_hash_encoding_is_the_documented_one() -> None:
    tree = tree_of({"src/main.py": b"print(1)\n"})
    leaf = hashlib.sha256(b"\x00print(1)\n").digest()
    src = hashlib.sha256(b"\x01" + struct.pack(">I", 7) + b"main.py" + leaf).digest()
    root = hashlib.sha256(b"\x01" + struct.pack(">I", 3) + b"src" + src).digest()
    assert tree.node("src/main.py").hash == leaf  # type: ignore[union-attr]
    assert tree.root_hash == root


def test_pairs_are_unambiguous() -> None:
    # Without length prefixes these two directories would hash the same bytes.
    one = tree_of({"ab": b"1"})
    two = tree_of({"a": b"1"})
    assert one.root_hash != two.root_hash
    assert directory_hash({}) != leaf_hash(b"")


@settings(max_examples=60, deadline=None)
@given(files=st.dictionaries(PATHS, CONTENTS, max_size=12), data=st.data())
def test_root_changes_exactly_when_content_changes(
    files: dict[str, bytes], data: st.DataObject
) -> None:
    files = consistent(files)
    tree = tree_of(files)
    if not files:
        return
    path = data.draw(st.sampled_from(sorted(files)))
    content = data.draw(CONTENTS)
    before = tree.root_hash
    tree.set_file(path, leaf_hash(content))
    assert (tree.root_hash != before) == (content != files[path])
    tree.set_file(path, leaf_hash(files[path]))
    assert tree.root_hash == before


EDITS = st.lists(
    st.tuples(st.sampled_from(["set", "remove"]), PATHS, CONTENTS), min_size=1, max_size=15
)


@settings(max_examples=80, deadline=None)
@given(files=st.dictionaries(PATHS, CONTENTS, max_size=10), edits=EDITS)
def test_diff_lists_exactly_the_edited_files(
    files: dict[str, bytes], edits: list[tuple[str, str, bytes]]
) -> None:
    files = consistent(files)
    old = tree_of(files)
    new = tree_of(files)
    current = dict(files)
    for action, path, content in edits:
        if action == "set":
            if clashes(current, path):
                continue  # a file and a directory of one name cannot coexist
            current[path] = content
            new.set_file(path, leaf_hash(content))
        elif path in current:
            del current[path]
            assert new.remove_file(path)
    # Incremental updates give the same tree as building from scratch.
    assert new.root_hash == tree_of(current).root_hash
    assert dict(new.leaves()) == {p: leaf_hash(d) for p, d in current.items()}
    diff = old.diff(new)
    assert diff.added == sorted(current.keys() - files.keys())
    assert diff.removed == sorted(files.keys() - current.keys())
    assert diff.changed == sorted(
        p for p in files.keys() & current.keys() if files[p] != current[p]
    )
    assert bool(diff) == (old.root_hash != new.root_hash)


def test_diff_skips_identical_subtrees() -> None:
    files = {f"big/{i}.py": bytes([i]) for i in range(50)} | {"small/x.py": b"x"}
    old, new = tree_of(files), tree_of(files)
    new.set_file("small/x.py", leaf_hash(b"y"))
    visited: list[str] = []
    big = new.node("big")
    assert big is not None and big.children is not None
    # Make any visit of the unchanged subtree's children observable.
    original = dict(big.children)

    class Spy(dict):  # type: ignore[type-arg]
        def items(self):  # type: ignore[no-untyped-def]
            visited.append("big")
            return super().items()

    big.children = Spy(original)
    assert old.diff(new).changed == ["small/x.py"]
    assert visited == []


def test_remove_prunes_empty_directories() -> None:
    tree = tree_of({"a/b/c.py": b"1", "d.py": b"2"})
    assert tree.remove_file("a/b/c.py")
    assert tree.node("a") is None
    assert tree.root_hash == tree_of({"d.py": b"2"}).root_hash
    assert not tree.remove_file("a/b/c.py")
