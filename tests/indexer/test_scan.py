"""Scanning: ignore rules, the deny list, binary and oversize files, symlinks, the stat cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from indexer.ignore import is_denied, is_excluded
from indexer.scan import FileStat, Scanner, StatCache, read_file


def write(root: Path, rel: str, data: str | bytes = "x = 1\n") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def scan_paths(root: Path, **kwargs: object) -> set[str]:
    return set(Scanner(root, **kwargs).scan(StatCache()).changed)  # type: ignore[arg-type]


def remember(root: Path, cache: StatCache, paths: list[str]) -> None:
    """What the pipeline does after reading: record each file's stat and hash.

    Files written moments ago are "racy" (their mtime is too close to now to be trusted) and
    would be read again; record their real stat, as a later scan would once time has passed.
    """
    for rel in paths:
        stat = read_file(root, rel, 1_000_000).stat
        st = os.stat(root / rel)
        cache.files[rel] = FileStat(st.st_mtime_ns, st.st_size, st.st_ino, stat.digest)


@pytest.mark.parametrize(
    ("name", "denied"),
    [
        pytest.param(".env", True, id="dotenv"),
        pytest.param(".env.production", True, id="dotenv-suffix"),
        pytest.param("server.pem", True, id="pem"),
        pytest.param("tls.key", True, id="key"),
        pytest.param("id_rsa", True, id="ssh-key"),
        pytest.param("id_ed25519.pub", True, id="ssh-pub"),
        pytest.param("credentials.json", True, id="credentials"),
        pytest.param(".netrc", True, id="netrc"),
        pytest.param("cert.p12", True, id="p12"),
        pytest.param("environment.py", False, id="not-dotenv"),
        pytest.param("keys.py", False, id="keys-module"),
        pytest.param("monkey.txt", False, id="key-substring"),
    ],
)
def test_deny_list(name: str, denied: bool) -> None:
    assert is_denied(name) is denied


def test_gitignore_at_every_level(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.log\nbuild/\n/top_only.py\n")
    write(tmp_path, "pkg/.gitignore", "!keep.log\nlocal_*.py\n")
    write(tmp_path, "pkg/sub/.tabloopignore", "generated.py\n")
    for rel in [
        "a.py",
        "x.log",
        "build/out.py",
        "top_only.py",
        "pkg/top_only.py",
        "pkg/keep.log",
        "pkg/other.log",
        "pkg/local_settings.py",
        "pkg/sub/generated.py",
        "pkg/sub/real.py",
        "pkg/sub/build/y.py",
    ]:
        write(tmp_path, rel)
    found = scan_paths(tmp_path)
    assert found == {
        ".gitignore",
        "a.py",
        "pkg/.gitignore",
        "pkg/top_only.py",
        "pkg/keep.log",
        "pkg/sub/.tabloopignore",
        "pkg/sub/real.py",
    }
    # The single-path check the watcher uses agrees with the walk.
    for rel in ["x.log", "build/out.py", "pkg/local_settings.py", "pkg/sub/generated.py"]:
        assert is_excluded(tmp_path, rel)
    assert not is_excluded(tmp_path, "pkg/keep.log")


def test_git_dir_info_exclude_and_settings(tmp_path: Path) -> None:
    write(tmp_path, ".git/HEAD", "ref: refs/heads/main\n")
    write(tmp_path, ".git/info/exclude", "scratch/\n")
    write(tmp_path, "scratch/notes.py")
    write(tmp_path, "vendor/lib.py")
    write(tmp_path, "main.py")
    assert scan_paths(tmp_path, exclude=["vendor/"]) == {"main.py"}


def test_secrets_are_never_indexed_even_when_reincluded(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "!.env\n!*.pem\n")
    write(tmp_path, ".env", "TOKEN=secret\n")
    write(tmp_path, "deploy/server.pem", "-----BEGIN PRIVATE KEY-----\n")
    write(tmp_path, "deploy/credentials.json", "{}")
    write(tmp_path, "app.py")
    assert scan_paths(tmp_path) == {".gitignore", "app.py"}
    assert is_excluded(tmp_path, ".env")


@pytest.mark.parametrize(
    ("data", "skip"),
    [
        pytest.param(b"text\n" * 10, "", id="text"),
        pytest.param(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary", id="nul-byte"),
        pytest.param(b"a" * 9000 + b"\x00", "", id="nul-after-probe"),
        pytest.param(b"y = 2\n" * 400, "too_large", id="oversize"),
        pytest.param("naïve = 'café'\n".encode(), "", id="utf8"),
    ],
)
def test_read_file_binary_and_size(tmp_path: Path, data: bytes, skip: str) -> None:
    write(tmp_path, "f.dat", data)
    content = read_file(tmp_path, "f.dat", max_bytes=2000 if skip == "too_large" else 100_000)
    assert content.stat.skip == skip
    assert (content.data is None) == bool(skip)
    assert (content.stat.digest is None) == bool(skip)


def test_symlink_loops_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, "a/b/real.py")
    os.symlink(tmp_path / "a", tmp_path / "a" / "b" / "loop")
    os.symlink(tmp_path, tmp_path / "root_again")
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    os.symlink(tmp_path / "a" / "b" / "real.py", tmp_path / "alias.py")
    found = scan_paths(tmp_path)
    assert found == {"a/b/real.py", "alias.py"}
    assert scan_paths(tmp_path, follow_symlinks=False) == {"a/b/real.py"}


def test_rescan_reads_only_what_changed(tmp_path: Path) -> None:
    for i in range(20):
        write(tmp_path, f"d{i % 4}/f{i}.py", f"v = {i}\n")
    scanner = Scanner(tmp_path)
    cache = StatCache()
    first = scanner.scan(cache)
    assert len(first.changed) == 20
    remember(tmp_path, cache, first.changed)
    again = scanner.scan(cache)
    assert again.changed == [] and again.removed == []
    write(tmp_path, "d1/f1.py", "v = 'changed'\n")
    (tmp_path / "d2/f2.py").unlink()
    write(tmp_path, "d3/new.py")
    later = scanner.scan(cache)
    assert sorted(later.changed) == ["d1/f1.py", "d3/new.py"]
    assert later.removed == ["d2/f2.py"]


def test_new_gitignore_rule_applies_on_rescan(tmp_path: Path) -> None:
    write(tmp_path, "pkg/a.py")
    write(tmp_path, "pkg/b.py")
    scanner = Scanner(tmp_path)
    cache = StatCache()
    remember(tmp_path, cache, scanner.scan(cache).changed)
    write(tmp_path, "pkg/.gitignore", "b.py\n")
    result = scanner.scan(cache)
    assert result.removed == ["pkg/b.py"]
    assert result.changed == ["pkg/.gitignore"]


def test_racy_files_are_read_again(tmp_path: Path) -> None:
    write(tmp_path, "a.py")
    content = read_file(tmp_path, "a.py", 1000)
    assert content.stat.mtime_ns == -1  # written just now: not trusted
    cache = StatCache(files={"a.py": content.stat})
    assert Scanner(tmp_path).scan(cache).changed == ["a.py"]
