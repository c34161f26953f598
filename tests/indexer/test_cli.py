"""`tabloop index` and `tabloop search` read the same configuration layers as the server."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from indexer.cli import resolve_settings
from indexer.store import index_dir
from tabloop.cli import main
from tests.indexer.conftest import copy_stdlib


@pytest.fixture
def no_user_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user `config.toml`, no `TABLOOP_*` settings, and a platform cache dir of our own."""
    for name in list(os.environ):
        if name.startswith("TABLOOP_") and not name.startswith("TABLOOP_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    platform_cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(platform_cache))
    return platform_cache


def workspace_file(kind: str, cache_dir: Path, embedder: Path) -> tuple[str, str]:
    """(file name, text) of a workspace configuration that moves the cache, changes the
    embedding model and excludes `private/`."""
    body = (
        f"cacheDir = {json.dumps(str(cache_dir))}\n"
        f"[{{table}}index]\n"
        f"embeddingModel = {json.dumps(str(embedder))}\n"
        'exclude = ["private/"]\n'
    )
    if kind == "tabloop.toml":
        return "tabloop.toml", body.replace("{table}", "")
    return "pyproject.toml", "[tool.tabloop]\n" + body.replace("{table}", "tool.tabloop.")


def index_model(cache_dir: Path, root: Path) -> str:
    """The embedding model an index on disk was built with."""
    with sqlite3.connect(index_dir(cache_dir, root) / "meta.sqlite3") as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'model'").fetchone()
    return str(row[0])


@pytest.mark.parametrize("kind", ["tabloop.toml", "pyproject.toml"])
def test_index_and_search_honour_the_workspace_configuration(
    kind: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    no_user_layers: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = copy_stdlib(tmp_path / "ws", ("bisect.py", "colorsys.py"))
    copy_stdlib(root / "private", ("fnmatch.py",))
    configured_cache = tmp_path / "configured-cache"
    name, text = workspace_file(kind, configured_cache, tiny_model_dir)
    (root / name).write_text(text, encoding="utf-8")

    assert main(["index", str(root), "--json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "configuration" not in err
    report = json.loads(out)
    assert report["chunks_embedded"] > 0
    # The configured cache directory and embedding model, not the platform's and `bundled`.
    assert str(tiny_model_dir) in index_model(configured_cache, root)
    assert not no_user_layers.exists()

    query = "translate a shell-style wildcard pattern into a regular expression"
    assert main(["search", query, "--path", str(root), "-k", "50", "--json", "--no-progress"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    paths = {hit["path"] for hit in hits}
    assert {"bisect.py", "colorsys.py"} <= paths
    assert not any(path.startswith("private/") for path in paths)  # excluded by the file
    assert not no_user_layers.exists()


def test_flags_override_the_workspace_configuration(
    tmp_path: Path,
    tiny_model_dir: Path,
    no_user_layers: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = copy_stdlib(tmp_path / "ws", ("colorsys.py",))
    configured_cache = tmp_path / "configured-cache"
    name, text = workspace_file("tabloop.toml", configured_cache, tiny_model_dir)
    (root / name).write_text(text, encoding="utf-8")
    flag_cache = tmp_path / "flag-cache"

    assert main(["index", str(root), "--cache-dir", str(flag_cache), "--no-progress"]) == 0
    capsys.readouterr()
    assert str(tiny_model_dir) in index_model(flag_cache, root)
    assert not configured_cache.exists()


def arguments(**given: Any) -> argparse.Namespace:
    """The parsed flags of `tabloop index`, none given unless named."""
    flags = {"cache_dir": None, "model": None, "backend_url": None, "token": None}
    return argparse.Namespace(**{**flags, **given})


@pytest.mark.parametrize(
    ("workspace", "environ", "flags", "check"),
    [
        pytest.param(
            '[index]\nmaxFileBytes = 5\n[completion]\nrunner = "carrier-pigeon"\n',
            {},
            {},
            lambda s, problems: s.index.max_file_bytes == 5 and problems == [],
            id="other-sections-are-not-the-command's-concern",
        ),
        pytest.param(
            "[index]\nmaxFileBytes = 0\nfollowSymlinks = false\n",
            {},
            {},
            lambda s, problems: (
                s.index.max_file_bytes == 1_000_000
                and s.index.follow_symlinks is False
                and len(problems) == 1
                and "index.maxFileBytes" in problems[0]
            ),
            id="bad-index-value-reported-rest-kept",
        ),
        pytest.param(
            '[index]\nembeddingModel = "from-file"\n',
            {"TABLOOP_INDEX__EMBEDDING_MODEL": "from-env"},
            {},
            lambda s, problems: s.index.embedding_model == "from-env",
            id="environment-over-workspace",
        ),
        pytest.param(
            '[index]\nembeddingModel = "from-file"\n',
            {"TABLOOP_INDEX__EMBEDDING_MODEL": "from-env"},
            {"model": "from-flag"},
            lambda s, problems: s.index.embedding_model == "from-flag",
            id="flag-over-environment",
        ),
        pytest.param(
            '[telemetry]\nbackendUrl = "http://backend"\ntoken = "t"\nlevel = "full"\n',
            {},
            {"token": "flag-token"},
            lambda s, problems: (
                (s.backend.url, s.backend.token) == ("http://backend", "flag-token")
                and problems == []
            ),
            id="sync-endpoint-from-the-old-telemetry-keys",
        ),
        pytest.param(
            '[backend]\nurl = "http://backend"\ntoken = "t"\n',
            {"TABLOOP_BACKEND__TOKEN": "env-token", "TABLOOP_BACKEND_PORT": "9000"},
            {},
            lambda s, problems: (
                s.backend.model_dump() == {"url": "http://backend", "token": "env-token"}
            ),
            id="sync-endpoint-from-the-backend-section",
        ),
    ],
)
def test_resolve_settings(
    workspace: str,
    environ: dict[str, str],
    flags: dict[str, Any],
    check: Any,
    tmp_path: Path,
    no_user_layers: Path,
) -> None:
    (tmp_path / "tabloop.toml").write_text(workspace, encoding="utf-8")
    resolved = resolve_settings(tmp_path, arguments(**flags), environ=environ)
    assert check(resolved.settings, resolved.problems), resolved.problems
