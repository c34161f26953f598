"""`tabloop stats`: names from the database are printed as text, and a database that is not
there, or a URL that names none, is said so in one line (nothing is created)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.stats_cli import stats_main
from backend.storage import Storage


@pytest.mark.parametrize(
    "tenant",
    [
        pytest.param("[/]", id="closing-tag"),
        pytest.param("[link=https://evil.example/]x[/link]", id="hyperlink"),
        pytest.param("[bold]loud[/bold]", id="style"),
    ],
)
def test_tenant_names_are_printed_not_interpreted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tenant: str
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    storage = Storage(url)
    storage.ensure_tenant(tenant)
    storage.close()
    assert stats_main(["--db", url, "--tenant", tenant]) == 0
    out = capsys.readouterr().out
    assert tenant in out
    assert "\x1b]8;" not in out  # no terminal hyperlink


def test_a_missing_database_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "x.sqlite3"
    with pytest.raises(SystemExit) as exit_info:
        stats_main(["--db", f"sqlite:///{missing}"])
    assert "no database at" in str(exit_info.value.code)
    assert not missing.parent.exists()


@pytest.mark.parametrize("url", ["bogus://host/db", "not a url", "postgresql+nodriver://h/db"])
def test_a_url_that_names_no_database_is_one_line(url: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        stats_main(["--db", url])
    message = str(exit_info.value.code)
    assert message.startswith("tabloop stats: ") and "\n" not in message
