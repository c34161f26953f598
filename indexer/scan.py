"""Walking a workspace: which files exist, which changed since the last scan, their contents.

A scan lists directories with `os.scandir` and applies the ignore rules (`indexer.ignore`). The
`StatCache` remembers, per file, (mtime_ns, size, inode) and the content hash, and per directory
its mtime and the names that passed the rules. A rescan re-lists only directories whose mtime
moved (an entry was added, removed or renamed) or whose ignore files changed; elsewhere it only
`stat`s the files it already knows. Only files whose stat changed are read and hashed.

Links are followed (unless the settings say otherwise) only while their resolved target stays
inside the workspace, and the deny list and the ignore rules are applied to the target's path as
well as the link's;
a file's content is checked for credentials when it is read (`indexer.secrets`).

Timestamps are coarse on many file systems, so a file or directory modified within `RACY_NS` of
when it was examined is not trusted next time (the "racy git" rule): it is read again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from indexer.ignore import (
    ALWAYS_SKIPPED_DIRS,
    IGNORE_FILES,
    IgnoreRules,
    denied_target,
    ignored_target,
    inside,
    real_root,
    rules_for,
)
from indexer.secrets import RULES_VERSION, find_secret, is_denied_entry

log = logging.getLogger(__name__)

RACY_NS = 2_000_000_000
BINARY_PROBE_BYTES = 8000
LEAF_PREFIX = b"\x00"
_STAT_KEY = attrgetter("st_mtime_ns", "st_size", "st_ino")


@dataclass(slots=True)
class FileStat:
    """What the last scan learnt about one file.

    `digest` is the file's Merkle leaf hash, None when the file is not indexed (`skip` says why:
    `binary`, `too_large`, `unreadable`, `secret`). `mtime_ns == -1` marks an entry not to be
    trusted.
    """

    mtime_ns: int
    size: int
    ino: int
    digest: bytes | None = None
    skip: str = ""


@dataclass(slots=True)
class DirListing:
    """A directory's entries that passed the rules, valid while its mtime is `mtime_ns`."""

    mtime_ns: int
    files: list[str]
    dirs: list[str]
    ignore_files: dict[str, tuple[int, int]] = field(default_factory=dict)
    # (mtime_ns, size, inode) of `files` when they all matched the file records, else None;
    # lets a rescan compare a whole directory with one list comparison.
    keys: list[tuple[int, int, int]] | None = None


@dataclass
class StatCache:
    """Per-file and per-directory stat records from the last scan, keyed by relative path."""

    files: dict[str, FileStat] = field(default_factory=dict)
    dirs: dict[str, DirListing] = field(default_factory=dict)
    fingerprint: str = ""


@dataclass
class ScanResult:
    """Files whose stat changed (to be read), files gone since the last scan, and counts."""

    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    touched_dirs: list[str] = field(default_factory=list)  # listings to persist again
    files_seen: int = 0
    dirs_listed: int = 0
    dirs_reused: int = 0
    denied: int = 0  # names (or link targets) on the deny list
    links_outside: int = 0  # links not followed: their target lies outside the workspace
    first_link_outside: str = ""  # one of them, for the log


@dataclass(frozen=True)
class FileContent:
    """A file read from disk: its bytes, or why it is not indexed."""

    rel_path: str
    stat: FileStat
    data: bytes | None

    @property
    def text(self) -> str:
        """The content decoded as UTF-8 (undecodable bytes replaced)."""
        return (self.data or b"").decode("utf-8", errors="replace")


def leaf_hash(data: bytes) -> bytes:
    """Merkle leaf hash of a file's bytes: SHA-256(0x00 ‖ bytes)."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def is_binary(data: bytes) -> bool:
    """A NUL byte in the first 8,000 bytes marks a binary file (git's heuristic)."""
    return b"\x00" in data[:BINARY_PROBE_BYTES]


def read_file(root: Path, rel_path: str, max_bytes: int) -> FileContent:
    """Read and hash one file, or record why it is skipped. Never raises for I/O errors."""
    path = root / rel_path
    now = time.time_ns()
    try:
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if st.st_size > max_bytes:
                return FileContent(rel_path, _stat_of(st, now, skip="too_large"), None)
            data = handle.read(max_bytes + 1)
    except OSError:
        return FileContent(rel_path, FileStat(-1, 0, 0, None, "unreadable"), None)
    if len(data) > max_bytes:  # grew while we read it
        return FileContent(rel_path, _stat_of(st, now, skip="too_large"), None)
    if is_binary(data):
        return FileContent(rel_path, _stat_of(st, now, skip="binary"), None)
    if find_secret(data) is not None:
        return FileContent(rel_path, _stat_of(st, now, skip="secret"), None)
    return FileContent(rel_path, _stat_of(st, now, digest=leaf_hash(data)), data)


def _stat_of(st: os.stat_result, now: int, digest: bytes | None = None, skip: str = "") -> FileStat:
    racy = st.st_mtime_ns >= now - RACY_NS
    return FileStat(-1 if racy else st.st_mtime_ns, st.st_size, st.st_ino, digest, skip)


class Scanner:
    """Finds the indexable files of one workspace and which of them changed."""

    def __init__(
        self, root: Path, *, exclude: Sequence[str] = (), follow_symlinks: bool = True
    ) -> None:
        self.root = root
        self.exclude = tuple(exclude)
        self.follow_symlinks = follow_symlinks
        self._root_real = real_root(root)
        # Rules in force in the directories links lead to, by path; emptied by every scan.
        self._target_rules: dict[str, IgnoreRules | None] = {}

    @property
    def fingerprint(self) -> str:
        """Settings and rules that decide the listing; a cache made under others is not reused.

        It starts with the secret rules' version, which also decides which contents are read.
        """
        settings = (self.exclude, self.follow_symlinks, _stat_key(self.root / ".git/info/exclude"))
        return f"{RULES_VERSION} {settings!r}"

    def scan(self, cache: StatCache) -> ScanResult:
        """Walk the tree, updating `cache.dirs`; `cache.files` is updated by the caller."""
        result = ScanResult()
        self._target_rules = {}
        force = cache.fingerprint != self.fingerprint
        if cache.fingerprint.split(" ", 1)[0] != RULES_VERSION:
            # Files indexed under older rules may hold what the current rules find: read every
            # file again once (unchanged ones are hashed, not re-embedded).
            for record in cache.files.values():
                record.mtime_ns = -1
        cache.fingerprint = self.fingerprint
        dirs: dict[str, DirListing] = {}
        visited: set[tuple[int, int]] = set()
        stack: list[_ToVisit] = [("", None, force, None)]
        while stack:
            rel_dir, parent_rules, forced, real_rel = stack.pop()
            self._visit(
                rel_dir, parent_rules, forced, real_rel, cache, dirs, visited, stack, result
            )
        if result.links_outside:
            log.info(
                "not following %d link(s) whose target lies outside the workspace, e.g. %s",
                result.links_outside,
                result.first_link_outside,
            )
        if result.missing or dirs.keys() != cache.dirs.keys() or result.dirs_listed:
            seen = {
                f"{rel_dir}/{name}" if rel_dir else name
                for rel_dir, listing in dirs.items()
                for name in listing.files
            }
            seen.difference_update(result.missing)
            result.removed = [rel for rel in cache.files if rel not in seen]
        result.files_seen = sum(len(listing.files) for listing in dirs.values()) - len(
            result.missing
        )
        cache.dirs = dirs
        return result

    def _visit(
        self,
        rel_dir: str,
        parent_rules: IgnoreRules | None,
        forced: bool,
        real_rel: str | None,
        cache: StatCache,
        dirs: dict[str, DirListing],
        visited: set[tuple[int, int]],
        stack: list[_ToVisit],
        result: ScanResult,
    ) -> None:
        """List (or reuse the listing of) one directory. `real_rel` is its path with links
        resolved when a link leads to it, else None."""
        abs_dir = os.path.join(self.root, rel_dir) if rel_dir else str(self.root)
        try:
            if rel_dir and self.follow_symlinks and stat.S_ISLNK(os.lstat(abs_dir).st_mode):
                # Checked here as well as when listed: a cached listing may predate a new target.
                real_rel = inside(self._root_real, abs_dir)
                if (
                    real_rel is None
                    or denied_target(real_rel, True)
                    or self._target_ignored(real_rel, True)
                ):
                    return
            st = os.stat(abs_dir)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key in visited:  # a symlink loop, or a second link to a directory already indexed
            return
        visited.add(key)
        listing = None if forced else cache.dirs.get(rel_dir)
        rules: IgnoreRules | None = None
        if listing is not None and (
            listing.mtime_ns != st.st_mtime_ns or not _ignore_files_unchanged(abs_dir, listing)
        ):
            forced = True  # new rules here apply to the whole subtree
            listing = None
        if listing is None:
            rules = self._rules(rel_dir, parent_rules)
            if rules is None:
                return
            listing = self._list(rel_dir, abs_dir, real_rel, st, rules, result)
            result.dirs_listed += 1
            result.touched_dirs.append(rel_dir)
        else:
            result.dirs_reused += 1
        dirs[rel_dir] = listing
        prefix = f"{rel_dir}/" if rel_dir else ""
        current = self._stat_all(abs_dir, listing.files)
        if current is None or current != listing.keys:
            keys = self._compare(prefix, listing.files, current, cache.files, result)
            if keys != listing.keys:
                listing.keys = keys
                result.touched_dirs.append(rel_dir)
        for name in listing.dirs:
            child_real = None if real_rel is None else f"{real_rel}/{name}".lstrip("/")
            stack.append((prefix + name, rules, forced, child_real))

    def _stat_all(self, abs_dir: str, names: list[str]) -> list[tuple[int, int, int]] | None:
        """(mtime_ns, size, inode) of every name, or None when one cannot be stat'ed."""
        try:
            fd = os.open(abs_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        try:
            follow = self.follow_symlinks
            return list(
                map(_STAT_KEY, [os.stat(n, dir_fd=fd, follow_symlinks=follow) for n in names])
            )
        except OSError:
            return None
        finally:
            os.close(fd)

    def _compare(
        self,
        prefix: str,
        names: list[str],
        current: list[tuple[int, int, int]] | None,
        files: dict[str, FileStat],
        result: ScanResult,
    ) -> list[tuple[int, int, int]] | None:
        """File by file: record changed and missing files; the keys to trust next time."""
        clean = current is not None
        for index, name in enumerate(names):
            rel = prefix + name
            if current is not None:
                key = current[index]
            else:
                try:
                    st = (os.stat if self.follow_symlinks else os.lstat)(self.root / rel)
                except OSError:
                    result.missing.append(rel)
                    continue
                key = _STAT_KEY(st)
            old = files.get(rel)
            if old is None or (old.mtime_ns, old.size, old.ino) != key:
                result.changed.append(rel)
                clean = False
        return current if clean else None

    def _target_ignored(self, target: str, is_dir: bool) -> bool:
        """Whether the ignore rules exclude where a link leads (`docs -> private`, `private/`
        ignored): a link is no way around `.gitignore`."""
        return ignored_target(self.root, target, is_dir, self.exclude, self._target_rules)

    def _rules(self, rel_dir: str, parent_rules: IgnoreRules | None) -> IgnoreRules | None:
        if parent_rules is None:
            return rules_for(self.root, rel_dir, self.exclude)
        lines: list[str] = []
        for name in IGNORE_FILES:
            try:
                text = (self.root / rel_dir / name).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            lines.extend(text.splitlines())
        return parent_rules.child(rel_dir, lines)

    def _list(
        self,
        rel_dir: str,
        abs_dir: str,
        real_rel: str | None,
        st: os.stat_result,
        rules: IgnoreRules,
        result: ScanResult,
    ) -> DirListing:
        prefix = f"{rel_dir}/" if rel_dir else ""
        real_prefix = None if real_rel is None else f"{real_rel}/" if real_rel else ""
        files: list[str] = []
        subdirs: list[str] = []
        ignore_files: dict[str, tuple[int, int]] = {}
        follow = self.follow_symlinks
        try:
            with os.scandir(abs_dir) as entries:
                for entry in entries:
                    name = entry.name
                    if name in ALWAYS_SKIPPED_DIRS:
                        continue
                    try:
                        link = entry.is_symlink()
                        if link and not follow:
                            continue
                        is_dir = entry.is_dir(follow_symlinks=follow)
                        is_file = not is_dir and entry.is_file(follow_symlinks=follow)
                    except OSError:
                        continue
                    target = None
                    if link:
                        target = inside(self._root_real, entry.path)
                        if target is None:
                            result.links_outside += 1
                            if not result.first_link_outside:
                                where = os.path.realpath(entry.path)
                                result.first_link_outside = f"{prefix}{name} -> {where}"
                            continue
                    elif real_prefix is not None:
                        target = real_prefix + name  # a link higher up led here
                    # The ancestors passed when they were listed: only the name is new here.
                    if is_denied_entry(rel_dir, name, is_dir) or (
                        target is not None and denied_target(target, is_dir)
                    ):
                        result.denied += 1
                        continue
                    if name in IGNORE_FILES and is_file:
                        ignore_files[name] = _stat_key(os.path.join(abs_dir, name))
                    if not (is_dir or is_file) or rules.ignored(prefix + name, is_dir):
                        continue
                    if target is not None and self._target_ignored(target, is_dir):
                        continue
                    (subdirs if is_dir else files).append(name)
        except OSError:
            pass
        racy = st.st_mtime_ns >= time.time_ns() - RACY_NS
        return DirListing(-1 if racy else st.st_mtime_ns, files, subdirs, ignore_files)


_ToVisit = tuple[str, IgnoreRules | None, bool, str | None]
"""A directory still to visit: its path, its parent's rules, whether it must be listed again,
and its path with links resolved (None when no link leads to it)."""


def _stat_key(path: str | Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def _ignore_files_unchanged(abs_dir: str, listing: DirListing) -> bool:
    return all(
        _stat_key(os.path.join(abs_dir, name)) == key for name, key in listing.ignore_files.items()
    )
