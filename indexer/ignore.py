"""Which paths of a workspace may be indexed: .gitignore rules, a deny list for secrets, defaults.

Rules are evaluated the way git does: every directory may hold a `.gitignore` (and a
`.tabloopignore`, with the same syntax) whose patterns are relative to that directory; the deepest
file with a matching pattern decides, and within one file the last matching pattern wins, so `!`
re-includes. `.git/info/exclude` and `IndexSettings.exclude` act as root-level files below the
root's own. An ignored directory is never entered, so nothing inside it can be re-included (git
behaves the same).

The deny list (`indexer.secrets`) is different: it is checked before any rule, on every path,
and cannot be re-included. It keeps credentials out of the index whatever a `.gitignore` says.
A symbolic link is judged by where it leads as well as by its own name: one whose target lies
outside the workspace is never followed, one whose target is denied is denied, and one whose
target the ignore rules exclude (`docs -> private` with `private/` in `.gitignore`) is excluded.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

from indexer.secrets import is_denied

IGNORE_FILES = (".gitignore", ".tabloopignore")
"""Per-directory ignore files, read at every level of the tree."""

ALWAYS_SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})

DEFAULT_EXCLUDES = (
    "node_modules/",
    "__pycache__/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    "*.pyc",
    "*.pyo",
    "*.so",
    "*.dylib",
    "*.dll",
    "*.exe",
    "*.o",
    "*.a",
    "*.class",
    "*.jar",
    "*.whl",
    "*.zip",
    "*.gz",
    "*.tgz",
    "*.bz2",
    "*.xz",
    "*.7z",
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.gif",
    "*.ico",
    "*.pdf",
    "*.woff",
    "*.woff2",
    "*.ttf",
    "*.min.js",
    "*.map",
    "package-lock.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.lock",
    "poetry.lock",
    "uv.lock",
)
"""Generated and binary files skipped by default; a `!pattern` in an ignore file re-includes."""


@dataclass(frozen=True)
class IgnoreRules:
    """The ignore patterns in force in one directory: its own files, then its parent's rules.

    `base` is the directory's path relative to the workspace root, `""` for the root, with `/`
    separators.
    """

    base: str
    spec: GitIgnoreSpec | None
    parent: IgnoreRules | None = None

    def ignored(self, rel_path: str, is_dir: bool) -> bool:
        """Whether `rel_path` (relative to the workspace root) is ignored by these rules."""
        rules: IgnoreRules | None = self
        while rules is not None:
            if rules.spec is not None:
                local = rel_path[len(rules.base) + 1 :] if rules.base else rel_path
                verdict = rules.spec.check_file(local + "/" if is_dir else local).include
                if verdict is not None:
                    return verdict
            rules = rules.parent
        return False

    def child(self, base: str, lines: Sequence[str]) -> IgnoreRules:
        """Rules for subdirectory `base` that holds ignore files with `lines`."""
        if not lines:
            return IgnoreRules(base, None, self) if self.spec is not None else self
        return IgnoreRules(base, GitIgnoreSpec.from_lines(lines), self)


def read_ignore_lines(paths: Iterable[Path]) -> list[str]:
    """Pattern lines of the ignore files that exist among `paths`, in order."""
    lines: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        lines.extend(text.splitlines())
    return lines


def root_rules(root: Path, extra: Sequence[str] = ()) -> IgnoreRules:
    """Rules at the workspace root: defaults, settings, `.git/info/exclude`, then root files."""
    defaults = IgnoreRules("", GitIgnoreSpec.from_lines([*DEFAULT_EXCLUDES, *extra]))
    info_exclude = read_ignore_lines([root / ".git" / "info" / "exclude"])
    with_exclude = defaults.child("", info_exclude) if info_exclude else defaults
    own = read_ignore_lines(root / name for name in IGNORE_FILES)
    return IgnoreRules("", GitIgnoreSpec.from_lines(own), with_exclude) if own else with_exclude


def rules_for(root: Path, rel_dir: str, extra: Sequence[str] = ()) -> IgnoreRules | None:
    """Rules in force in directory `rel_dir`, or None when it or an ancestor is excluded."""
    rules = root_rules(root, extra)
    if not rel_dir:
        return rules
    so_far = ""
    for part in rel_dir.split("/"):
        so_far = f"{so_far}/{part}" if so_far else part
        if part in ALWAYS_SKIPPED_DIRS or is_denied(so_far, True) or rules.ignored(so_far, True):
            return None
        lines = read_ignore_lines(root / so_far / name for name in IGNORE_FILES)
        rules = rules.child(so_far, lines)
    return rules


def real_root(root: Path | str) -> str:
    """The workspace root with every link resolved, as `inside` expects it."""
    return os.path.realpath(root)


def inside(root_real: str, path: str) -> str | None:
    """Where `path` leads, relative to `root_real` with `/` separators (`""` for the root itself),
    or None when its resolved target lies outside the workspace."""
    target = os.path.realpath(path)
    if target == root_real:
        return ""
    prefix = root_real.rstrip(os.sep) + os.sep
    if not target.startswith(prefix):
        return None
    return target[len(prefix) :].replace(os.sep, "/")


def denied_target(target_rel: str, is_dir: bool) -> bool:
    """Whether the resolved target of a link (relative to the root) may not be indexed: it is on
    the deny list, or inside `.git` and its kin."""
    parts = target_rel.split("/")
    return any(part in ALWAYS_SKIPPED_DIRS for part in parts) or is_denied(target_rel, is_dir)


def ignored_target(
    root: Path,
    target_rel: str,
    is_dir: bool,
    extra: Sequence[str] = (),
    rules: dict[str, IgnoreRules | None] | None = None,
) -> bool:
    """Whether the ignore rules exclude the resolved target of a link (relative to the root):
    a link must not lead the index into what `.gitignore` keeps out. `rules` caches
    `rules_for` by directory across calls (the entries of one linked directory share it)."""
    if not target_rel:
        return False  # the root itself
    parent = posixpath.dirname(target_rel)
    if rules is None:
        in_force = rules_for(root, parent, extra)
    else:
        if parent not in rules:
            rules[parent] = rules_for(root, parent, extra)
        in_force = rules[parent]
    return in_force is None or in_force.ignored(target_rel, is_dir)


def is_excluded(
    root: Path, rel_path: str, extra: Sequence[str] = (), follow_symlinks: bool = True
) -> bool:
    """Whether file `rel_path` is kept out of the index by the deny list, any ignore rule, or
    where it leads: outside the workspace, to a denied file, or through a link when links are
    not followed, or ignored. The single-path check of the watcher and the editor's buffers."""
    name = rel_path.rsplit("/", 1)[-1]
    if is_denied(rel_path) or name in ALWAYS_SKIPPED_DIRS:
        return True
    target = inside(real_root(root), os.path.join(root, rel_path))
    if target is None:
        return True
    # Compare against the path with only the root's own links resolved.
    if target != rel_path and (
        not follow_symlinks
        or denied_target(target, False)
        or ignored_target(root, target, False, extra)
    ):
        return True
    rules = rules_for(root, os.path.dirname(rel_path), extra)
    return rules is None or rules.ignored(rel_path, False)
