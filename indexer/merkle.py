"""A Merkle tree over the indexed files of a workspace.

Hashes are SHA-256 and domain-separated, so a file can never collide with a directory:

- leaf (file): ``H(0x00 ‖ file bytes)`` (computed by `indexer.scan.leaf_hash`);
- directory: ``H(0x01 ‖ for each child sorted by UTF-8 name: len(name) as 4-byte big-endian ‖
  name ‖ child hash)``. The length prefix makes the encoding of the pairs unambiguous.

Only directories that hold at least one indexed file appear in the tree (as in git). Paths are
relative to the workspace root with `/` separators; the root directory's path is `""`.

`set_file` and `remove_file` recompute only the hashes on the path from the file to the root;
`diff` walks only subtrees whose hashes differ. `indexer.sync` builds the client side of the index
sync on `node`, `diff` and `leaves`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

DIR_PREFIX = b"\x01"
HASH_BYTES = 32


@dataclass
class MerkleNode:
    """A file (no children) or a directory, with its hash."""

    name: str
    hash: bytes
    children: dict[str, MerkleNode] | None = None

    @property
    def is_dir(self) -> bool:
        return self.children is not None


def directory_hash(children: Mapping[str, MerkleNode]) -> bytes:
    """Hash of a directory from its children's names and hashes."""
    digest = hashlib.sha256(DIR_PREFIX)
    for name in sorted(children, key=lambda n: n.encode("utf-8")):
        encoded = name.encode("utf-8")
        digest.update(struct.pack(">I", len(encoded)))
        digest.update(encoded)
        digest.update(children[name].hash)
    return digest.digest()


EMPTY_ROOT = directory_hash({})


@dataclass
class TreeDiff:
    """Files that differ between two trees (relative paths, sorted)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


class MerkleTree:
    """The tree of indexed files; not thread-safe (the index writer owns it)."""

    def __init__(self) -> None:
        self.root = MerkleNode("", EMPTY_ROOT, {})

    @classmethod
    def from_leaves(cls, leaves: Mapping[str, bytes]) -> MerkleTree:
        """Build a tree from `{path: leaf hash}`, hashing each directory once."""
        tree = cls()
        assert tree.root.children is not None
        for path, leaf in leaves.items():
            node = tree.root
            parts = path.split("/")
            for part in parts[:-1]:
                assert node.children is not None
                child = node.children.get(part)
                if child is None or child.children is None:
                    child = node.children[part] = MerkleNode(part, b"", {})
                node = child
            assert node.children is not None
            node.children[parts[-1]] = MerkleNode(parts[-1], _check(leaf))
        _rehash(tree.root)
        return tree

    @property
    def root_hash(self) -> bytes:
        return self.root.hash

    def node(self, path: str) -> MerkleNode | None:
        """The node at `path` (`""` is the root), or None."""
        node = self.root
        if not path:
            return node
        for part in path.split("/"):
            if node.children is None or part not in node.children:
                return None
            node = node.children[part]
        return node

    def leaves(self) -> Iterator[tuple[str, bytes]]:
        """Every (file path, leaf hash), depth first in name order."""
        stack: list[tuple[str, MerkleNode]] = [("", self.root)]
        while stack:
            prefix, node = stack.pop()
            assert node.children is not None
            for name in sorted(node.children, reverse=True):
                child = node.children[name]
                path = f"{prefix}/{name}" if prefix else name
                if child.children is None:
                    yield path, child.hash
                else:
                    stack.append((path, child))

    def __len__(self) -> int:
        return sum(1 for _ in self.leaves())

    def set_file(self, path: str, leaf: bytes) -> None:
        """Add or update a file, rehashing its ancestors only."""
        parts = path.split("/")
        trail = [self.root]
        for part in parts[:-1]:
            node = trail[-1]
            assert node.children is not None
            child = node.children.get(part)
            if child is None or child.children is None:
                child = node.children[part] = MerkleNode(part, EMPTY_ROOT, {})
            trail.append(child)
        parent = trail[-1]
        assert parent.children is not None
        parent.children[parts[-1]] = MerkleNode(parts[-1], _check(leaf))
        for node in reversed(trail):
            assert node.children is not None
            node.hash = directory_hash(node.children)

    def remove_file(self, path: str) -> bool:
        """Remove a file; directories left empty go too. False when it was not in the tree."""
        parts = path.split("/")
        trail = [self.root]
        for part in parts[:-1]:
            children = trail[-1].children
            if children is None or part not in children:
                return False
            trail.append(children[part])
        parent_children = trail[-1].children
        leaf = None if parent_children is None else parent_children.get(parts[-1])
        if parent_children is None or leaf is None or leaf.children is not None:
            return False
        del parent_children[parts[-1]]
        for depth in range(len(trail) - 1, -1, -1):
            node = trail[depth]
            assert node.children is not None
            if depth and not node.children:
                parent = trail[depth - 1].children
                assert parent is not None
                del parent[node.name]
            else:
                node.hash = directory_hash(node.children)
        return True

    def diff(self, other: MerkleTree) -> TreeDiff:
        """What changes from this tree to `other`, visiting only subtrees whose hashes differ."""
        result = TreeDiff()
        _diff(self.root, other.root, "", result)
        result.added.sort()
        result.changed.sort()
        result.removed.sort()
        return result


def _check(leaf: bytes) -> bytes:
    if len(leaf) != HASH_BYTES:
        raise ValueError(f"a leaf hash is {HASH_BYTES} bytes, got {len(leaf)}")
    return leaf


def _rehash(node: MerkleNode) -> bytes:
    if node.children is None:
        return node.hash
    for child in node.children.values():
        _rehash(child)
    node.hash = directory_hash(node.children)
    return node.hash


def _files_under(node: MerkleNode, path: str) -> Iterator[str]:
    if node.children is None:
        yield path
        return
    for name, child in node.children.items():
        yield from _files_under(child, f"{path}/{name}" if path else name)


def _diff(old: MerkleNode, new: MerkleNode, path: str, out: TreeDiff) -> None:
    if old.hash == new.hash and old.is_dir == new.is_dir:
        return
    if old.children is None or new.children is None:
        if old.children is None and new.children is None:
            out.changed.append(path)
        else:  # a file became a directory or the reverse
            out.removed.extend(_files_under(old, path))
            out.added.extend(_files_under(new, path))
        return
    for name, child in old.children.items():
        child_path = f"{path}/{name}" if path else name
        other = new.children.get(name)
        if other is None:
            out.removed.extend(_files_under(child, child_path))
        else:
            _diff(child, other, child_path, out)
    for name, child in new.children.items():
        if name not in old.children:
            out.added.extend(_files_under(child, f"{path}/{name}" if path else name))
