"""The VS Code extension's settings cannot drift from the server's settings model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from lsp_server.config import Settings
from tests.editors.conftest import REPO

SCRIPT = REPO / "editors" / "vscode" / "scripts" / "gen_configuration.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_configuration", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def generator() -> ModuleType:
    return load_generator()


def leaf_settings(
    model: type[BaseModel] = Settings, prefix: str = ""
) -> list[tuple[str, object, str]]:
    """(dotted camelCase key, default, description) of every leaf of the settings model."""
    leaves: list[tuple[str, object, str]] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{to_camel(name)}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves.extend(leaf_settings(annotation, f"{key}."))
        else:
            default = info.get_default(call_default_factory=True)
            leaves.append((key, default, info.description or ""))
    return leaves


def contributed(package_json: Path) -> dict[str, dict[str, object]]:
    package = json.loads(package_json.read_text(encoding="utf-8"))
    properties: dict[str, dict[str, object]] = package["contributes"]["configuration"]["properties"]
    return properties


def test_package_json_is_up_to_date(
    generator: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert generator.main(["--check"]) == 0, capsys.readouterr().err


def test_every_server_setting_is_contributed_with_its_default(generator: ModuleType) -> None:
    properties = contributed(generator.PACKAGE_JSON)
    for key, default, description in leaf_settings():
        name = f"tabloop.{key}"
        if key in generator.NOT_CONTRIBUTED:
            assert name not in properties, f"{name} is set by the editor or moved, not offered"
            continue
        assert name in properties, f"{name} missing from package.json"
        assert properties[name]["default"] == default, name
        assert properties[name]["markdownDescription"] == description, name
    assert "tabloop.server.path" in properties
    assert "tabloop.trace.server" in properties


def test_enums_and_bounds_are_carried() -> None:
    properties = contributed(REPO / "editors" / "vscode" / "package.json")
    assert properties["tabloop.logLevel"]["enum"] == ["error", "warning", "info", "debug"]
    assert properties["tabloop.completion.maxNewTokens"]["minimum"] == 1
    assert properties["tabloop.completion.maxNewTokens"]["maximum"] == 1024
    assert properties["tabloop.completion.httpTimeoutS"]["exclusiveMinimum"] == 0


def test_check_fails_on_a_drifted_copy(
    generator: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drifted = tmp_path / "package.json"
    package = json.loads(generator.PACKAGE_JSON.read_text(encoding="utf-8"))
    package["contributes"]["configuration"]["properties"]["tabloop.completion.maxNewTokens"][
        "default"
    ] = 7
    drifted.write_text(json.dumps(package, indent=2) + "\n", encoding="utf-8")
    monkeypatch.setattr(generator, "PACKAGE_JSON", drifted)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0  # regenerating repairs it
    assert generator.main(["--check"]) == 0
    assert contributed(drifted)["tabloop.completion.maxNewTokens"]["default"] == 64


def test_moved_keys_are_not_offered(generator: ModuleType) -> None:
    from common.endpoint import MOVED_KEYS

    properties = contributed(generator.PACKAGE_JSON)
    assert generator.MOVED == set(MOVED_KEYS)
    for old, new in MOVED_KEYS.items():
        assert f"tabloop.{old}" not in properties and f"tabloop.{new}" in properties
