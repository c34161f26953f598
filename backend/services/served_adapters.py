"""The tenants' serving adapters as `GET /v1/model` and its files answer them, verified.

Which version serves a client is read from the tenant's registry in the database
(`backend.adapters.registry`), and the version is served from this instance's copy of its files
under the cache directory, fetched from the blob store and checked against the checksums the
database holds. Every file of a version is checked against its manifest, and the manifest against
the database's checksum, before anything of it is served. A version that verified is remembered
by the manifest's SHA-256 and the identity of its files (inode, size, modification and change
times): a poll costs reading the registry's row, the small manifest and two `stat` calls, and a
file rewritten in place (its change time moves, whatever it was set to) is hashed again before it
is served. A copy that no longer checks out is fetched again; a blob that does not match its
checksum is refused (503), never served. Error messages name the version, never a server path
or the store's URL.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backend.adapters.registry import TenantAdapters
from completion.adapters import CONFIG, MANIFEST, WEIGHTS, AdapterError, verify_adapter
from training.registry import AdapterRegistryError, version_label

CHECKED_FILES = (CONFIG, WEIGHTS)
SERVING_ARM = "serving"
CANARY_ARM = "canary"


class AdapterUnavailable(Exception):
    """The serving adapter cannot be served (a damaged version or registry): the message is
    fit for the client, with no server path in it."""


@dataclass(frozen=True)
class ServedAdapter:
    """A verified serving version: its name, directory and manifest (the bytes that were
    checked, whose SHA-256 is the version's checksum)."""

    name: str
    directory: Path
    manifest: dict[str, Any]
    manifest_bytes: bytes
    checksum: str
    identities: dict[str, tuple[int, int, int, int]]
    """Per checked file: (inode, size, mtime_ns, ctime_ns) when it was hashed."""
    arm: str = SERVING_ARM
    """`canary` when the client asking is on a running canary's arm, else `serving`."""

    def describe(self) -> dict[str, Any]:
        """The body of `GET /v1/model`."""
        return {
            "version": self.name,
            "arm": self.arm,
            "base_model": self.manifest.get("base_model"),
            "checksum": self.checksum,
            "files": {name: self.manifest["files"][name] for name in CHECKED_FILES},
        }

    def unchanged(self, name: str) -> bool:
        """Whether file `name` is still the one that was verified."""
        return _identity(self.directory / name) == self.identities[name]


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _redact(text: str, *roots: Path) -> str:
    """`text` without the server's paths: `roots` become names relative to them."""
    for root in roots:
        text = text.replace(f"{root}{os.sep}", "").replace(str(root), root.name)
    return text


class ServedAdapters:
    """The serving adapter of each tenant, verified once per change of its files."""

    def __init__(self, adapters: TenantAdapters) -> None:
        self.adapters = adapters
        self.cache_dir = adapters.cache_dir
        self._verified: dict[Path, ServedAdapter] = {}
        self._lock = threading.Lock()
        self.verifications = 0
        """How many times a version's files were hashed (a test reads it)."""

    def serving(self, tenant: str, client: str | None = None) -> ServedAdapter | None:
        """The version the tenant's client `client` (its installation's id) should serve,
        verified: the canary on its share of clients while one runs (`arm` says which), else
        the serving version; None when the base model serves. Without `client`, the serving
        version. `AdapterUnavailable` for a damaged version or registry."""
        try:
            registry = self.adapters.registry(tenant)
        except ValueError:  # a tenant name that cannot name an adapter directory has none
            return None
        root = registry.root
        try:
            version = registry.serving() if client is None else registry.serving_for(client)
            canary = registry.canary() if client is not None else None
            if version is None:
                return None
            name = version_label(version)
            manifest_checksum = registry.files(version)[MANIFEST]
        except (AdapterRegistryError, OSError) as exc:
            reason = _redact(str(exc), root, self.cache_dir)
            raise AdapterUnavailable(f"the adapter registry is unreadable: {reason}") from None
        try:
            served = self._verify(name, root / name, root, manifest_checksum)
        except AdapterUnavailable:
            # This instance's copy does not check out: fetch it again from the blob store.
            try:
                directory = registry.path(version)
            except AdapterRegistryError as exc:
                reason = _redact(str(exc), root, self.cache_dir)
                raise AdapterUnavailable(
                    f"the serving adapter {name} is damaged: {reason}"
                ) from None
            served = self._verify(name, directory, root, manifest_checksum)
        if canary is not None and canary.version == version:
            return replace(served, arm=CANARY_ARM)
        return served

    def _verify(
        self, name: str, directory: Path, root: Path, manifest_checksum: str
    ) -> ServedAdapter:
        try:
            manifest_bytes = (directory / MANIFEST).read_bytes()
        except OSError:
            raise AdapterUnavailable(
                f"the serving adapter {name} is damaged: no readable {MANIFEST}"
            ) from None
        checksum = hashlib.sha256(manifest_bytes).hexdigest()
        if checksum != manifest_checksum:
            raise AdapterUnavailable(
                f"the serving adapter {name} is damaged: its {MANIFEST} is not the registry's"
            )
        identities = {file: _identity(directory / file) for file in CHECKED_FILES}
        with self._lock:
            known = self._verified.get(directory)
        if (
            known is not None
            and known.checksum == checksum
            and all(identities[file] == known.identities[file] for file in CHECKED_FILES)
        ):
            return known
        try:
            manifest = json.loads(manifest_bytes)
            if not isinstance(manifest, dict):
                raise AdapterError(f"{MANIFEST} is not an adapter manifest")
            self.verifications += 1
            verified = verify_adapter(directory)
        except (AdapterError, ValueError) as exc:
            reason = _redact(str(exc), directory, root, self.cache_dir)
            raise AdapterUnavailable(f"the serving adapter {name} is damaged: {reason}") from None
        if verified != manifest:  # rewritten between the two reads: check it again next time
            raise AdapterUnavailable(f"the serving adapter {name} changed while being checked")
        served = ServedAdapter(
            name=name,
            directory=directory,
            manifest=manifest,
            manifest_bytes=manifest_bytes,
            checksum=checksum,
            # Taken before hashing: a file changed during the hash does not match them later.
            identities={file: identity for file, identity in identities.items() if identity},
        )
        if len(served.identities) != len(CHECKED_FILES):
            raise AdapterUnavailable(f"the serving adapter {name} changed while being checked")
        with self._lock:
            self._verified[directory] = served
        return served
