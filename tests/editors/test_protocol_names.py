"""The editors' copies of the LSP names cannot drift from `lsp_server/protocol.py`."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from lsp_server import protocol
from tests.editors.conftest import REPO

SCRIPT = REPO / "editors" / "vscode" / "scripts" / "gen_protocol.py"
VSCODE_SOURCES = sorted((REPO / "editors" / "vscode" / "src").glob("*.ts"))
NEOVIM_SOURCES = sorted((REPO / "editors" / "neovim").rglob("*.lua"))


@pytest.fixture
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protocol", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date(
    generator: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert generator.main(["--check"]) == 0, capsys.readouterr().err


def test_every_method_name_is_generated(generator: ModuleType) -> None:
    typescript = generator.TYPESCRIPT.read_text(encoding="utf-8")
    lua = generator.LUA.read_text(encoding="utf-8")
    for name in ("ACCEPT_COMMAND", "STATUS_REQUEST", "SEARCH_REQUEST", "DID_SHOW_NOTIFICATION"):
        value = getattr(protocol, name)
        assert f"export const {name} = '{value}';" in typescript
        assert f"  {name} = '{value}'," in lua


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(path, id=str(path.relative_to(REPO)))
        for path in VSCODE_SOURCES + NEOVIM_SOURCES
        if path.name not in ("protocol.ts", "protocol.lua")
    ],
)
def test_editor_code_spells_no_method_by_hand(source: Path) -> None:
    """Method and command names come from the generated module, never a string literal."""
    text = source.read_text(encoding="utf-8")
    literals = re.findall(r"""['"](tabloop(?:/\w+|\.accept))['"]""", text)
    assert literals == [], f"{source.name} spells {literals}; use the generated protocol module"


def test_check_fails_on_a_drifted_copy(
    generator: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drifted = tmp_path / "protocol.lua"
    drifted.write_text(
        generator.LUA.read_text(encoding="utf-8").replace("tabloop/didShow", "tabloop/shown"),
        encoding="utf-8",
    )
    monkeypatch.setattr(generator, "LUA", drifted)
    monkeypatch.setattr(generator, "TYPESCRIPT", tmp_path / "protocol.ts")  # missing: drifted too
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0  # regenerating repairs both
    assert generator.main(["--check"]) == 0
    assert "'tabloop/didShow'" in drifted.read_text(encoding="utf-8")
