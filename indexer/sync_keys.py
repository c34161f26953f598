"""Keyed identities of the index sync: what the server sees instead of paths and content.

A workspace secret, kept on the client, keys HMAC-SHA256 over everything that would reveal code
or paths. The server only ever sees:

- keyed path segments (`segment`): 16-byte HMACs in hex, joined by `/` into opaque file ids;
- keyed leaf hashes (`leaf`): an HMAC of the file's Merkle leaf, so equal files are not
  recognisable across tenants or against public code;
- keyed chunk keys (`chunk`): an HMAC of the chunk's content hash, the address of its vector;
- a keyed model id and workspace id.

Directory hashes are the ordinary Merkle directory hashes (`indexer.merkle.directory_hash`)
computed over keyed names and keyed child hashes, so the server can recompute them from what it
stores and compare roots with the client.

Two clients with the same secret derive the same keys for the same content: that is what lets a
teammate reuse embeddings. Without the secret (or without the content) a key cannot be guessed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from indexer.merkle import MerkleTree

KEY_BYTES = 16  # 128-bit ids: collision-free in practice, half the bytes on the wire
SECRET_FILE = "secret"


def load_or_create_secret(directory: Path) -> str:
    """The workspace secret kept in `directory/secret` (mode 0600), created on first use."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SECRET_FILE
    try:
        existing = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        existing = ""
    if existing:
        return existing
    secret = secrets.token_hex(32)
    temp = path.with_name(f"{SECRET_FILE}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secret + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # link() fails when another process created the secret first: theirs wins, both agree.
        os.link(temp, path)
    except FileExistsError:
        return path.read_text(encoding="ascii").strip()
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()
    return secret


class SyncKeys:
    """Derives the keyed identities of one secret (a string: generated hex or a passphrase)."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the sync secret is empty")
        # Hashing first accepts any passphrase a team configures as key material.
        self._key = hashlib.sha256(b"tabloop sync secret\x00" + secret.encode("utf-8")).digest()
        self._segments: dict[str, str] = {}

    def _mac(self, domain: bytes, data: bytes, size: int = KEY_BYTES) -> str:
        return hmac.new(self._key, domain + b"\x00" + data, hashlib.sha256).digest()[:size].hex()

    def segment(self, name: str) -> str:
        """The keyed form of one path segment (file or directory name)."""
        found = self._segments.get(name)
        if found is None:
            found = self._segments[name] = self._mac(b"segment", name.encode("utf-8"))
        return found

    def path(self, rel_path: str) -> str:
        """The opaque id of a workspace-relative path: its keyed segments joined by `/`."""
        return "/".join(self.segment(part) for part in rel_path.split("/"))

    def leaf(self, leaf_hash: bytes) -> bytes:
        """The keyed Merkle leaf of a file (32 bytes, like every node hash)."""
        return bytes.fromhex(self._mac(b"leaf", leaf_hash, 32))

    def chunk(self, chunk_id: str) -> str:
        """The keyed address of a chunk's vector, from its content hash (hex)."""
        return self._mac(b"chunk", bytes.fromhex(chunk_id))

    def model(self, model_id: str) -> str:
        """The keyed embedding model id (a local model's id names a local path)."""
        return self._mac(b"model", model_id.encode("utf-8"))

    def workspace(self, name: str) -> str:
        """The keyed id of a workspace, from a name the client chooses (its root path)."""
        return self._mac(b"workspace", name.encode("utf-8"))

    def tree(self, leaves: Mapping[str, bytes]) -> tuple[MerkleTree, dict[str, str]]:
        """The keyed Merkle tree of `{path: leaf hash}`, and `{keyed path: path}`."""
        plain_of = {self.path(path): path for path in leaves}
        keyed = {keyed: self.leaf(leaves[path]) for keyed, path in plain_of.items()}
        return MerkleTree.from_leaves(keyed), plain_of
