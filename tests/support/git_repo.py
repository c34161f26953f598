"""A small git repository built in a test: a sequence of commits, each a set of file contents."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.org",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with a fixed identity and no user configuration; its stdout."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **_ENV},
    )
    return done.stdout


def make_repo(root: Path, commits: Sequence[Mapping[str, str | None]]) -> list[str]:
    """A repository at `root` with one commit per mapping (path -> text, None deletes the
    file); the commits' ids, oldest first."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    ids = []
    for number, files in enumerate(commits):
        for path, text in files.items():
            target = root / path
            if text is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        git(root, "add", "-A")
        git(root, "commit", "-q", "--allow-empty", "-m", f"commit {number}")
        ids.append(git(root, "rev-parse", "HEAD").strip())
    return ids
