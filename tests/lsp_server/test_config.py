"""Configuration layering: defaults < user < workspace < environment < init options < client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from lsp_server import config


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    return tmp_path / "user" / "config.toml"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


LAYER_CASES = [
    pytest.param({}, "bundled", "default", id="defaults"),
    pytest.param({"user": '[completion]\nmodel = "user-model"\n'}, "user-model", "user", id="user"),
    pytest.param(
        {
            "user": '[completion]\nmodel = "user-model"\n',
            "workspace": '[completion]\nmodel = "ws-model"\n',
        },
        "ws-model",
        "workspace",
        id="workspace-over-user",
    ),
    pytest.param(
        {"pyproject": '[tool.tabloop.completion]\nmodel = "pyproject-model"\n'},
        "pyproject-model",
        "workspace",
        id="pyproject-tool-table",
    ),
    pytest.param(
        {
            "workspace": '[completion]\nmodel = "ws-model"\n',
            "env": {"TABLOOP_COMPLETION__MODEL": "env-model"},
        },
        "env-model",
        "environment",
        id="environment-over-workspace",
    ),
    pytest.param(
        {
            "env": {"TABLOOP_COMPLETION__MODEL": "env-model"},
            "init": {"completion": {"model": "init-model"}},
        },
        "init-model",
        "initializationOptions",
        id="init-options-over-environment",
    ),
    pytest.param(
        {
            "init": {"completion": {"model": "init-model"}},
            "client": {"completion": {"model": "client-model"}},
        },
        "client-model",
        "workspace/configuration",
        id="client-configuration-wins",
    ),
    pytest.param(
        {"client": {"tabloop": {"completion": {"model": "wrapped"}}}},
        "wrapped",
        "workspace/configuration",
        id="client-wrapped-in-section-name",
    ),
]


@pytest.mark.parametrize(("layers", "model", "source"), LAYER_CASES)
def test_layers_in_order(
    layers: dict[str, Any], model: str, source: str, user_file: Path, workspace: Path
) -> None:
    if "user" in layers:
        write(user_file, layers["user"])
    if "workspace" in layers:
        write(workspace / "tabloop.toml", layers["workspace"])
    if "pyproject" in layers:
        write(workspace / "pyproject.toml", layers["pyproject"])
    resolved = config.resolve(
        workspace,
        init_options=layers.get("init"),
        client_config=layers.get("client"),
        environ=layers.get("env", {}),
        user_file=user_file,
    )
    assert resolved.problems == []
    assert resolved.settings.completion.model == model
    assert resolved.source_of("completion.model") == source


@pytest.mark.parametrize(
    ("options", "field", "expected"),
    [
        pytest.param({"completion": {"maxNewTokens": 17}}, "max_new_tokens", 17, id="camelCase"),
        pytest.param({"completion": {"max_new_tokens": 18}}, "max_new_tokens", 18, id="snake_case"),
        pytest.param(
            {"completion": {"contextTimeoutMs": 5}}, "context_timeout_ms", 5, id="acronym"
        ),
    ],
)
def test_key_spellings(options: dict[str, Any], field: str, expected: object) -> None:
    resolved = config.resolve(None, init_options=options, environ={})
    assert getattr(resolved.settings.completion, field) == expected


@pytest.mark.parametrize(
    ("env", "check"),
    [
        pytest.param(
            {"TABLOOP_COMPLETION__MAX_NEW_TOKENS": "12"},
            lambda s: s.completion.max_new_tokens == 12,
            id="number",
        ),
        pytest.param(
            {"TABLOOP_COMPLETION__ENABLED": "false"},
            lambda s: s.completion.enabled is False,
            id="boolean",
        ),
        pytest.param(
            {"TABLOOP_TELEMETRY": "off"}, lambda s: s.telemetry.level == "off", id="opt-out"
        ),
        pytest.param({"TABLOOP_LOG_LEVEL": "debug"}, lambda s: s.log_level == "debug", id="top"),
        pytest.param(
            {"TABLOOP_TEST_POSTGRES_URL": "postgresql://x"},
            lambda s: s == config.Settings(),
            id="test-plumbing-ignored",
        ),
        pytest.param(
            {"TABLOOP_BACKEND_PORT": "9000", "TABLOOP_BACKEND__URL": "http://b"},
            lambda s: s.backend.url == s.telemetry.backend_url == "http://b",
            id="the-backend-server-s-own-variables-ignored",
        ),
    ],
)
def test_environment(env: dict[str, str], check: Any) -> None:
    resolved = config.resolve(None, environ=env)
    assert resolved.problems == []
    assert check(resolved.settings)


@pytest.mark.parametrize(
    ("options", "bad_key"),
    [
        pytest.param({"completion": {"maxNewTokens": 100000}}, "max_new_tokens", id="out-of-range"),
        pytest.param({"completion": {"temperature": "hot"}}, "temperature", id="wrong-type"),
        pytest.param({"completion": {"runner": "carrier-pigeon"}}, "runner", id="bad-choice"),
        pytest.param({"completion": {"modle": "typo"}}, "modle", id="unknown-key"),
    ],
)
def test_invalid_values_fall_back_to_defaults_and_keep_the_rest(
    options: dict[str, Any], bad_key: str
) -> None:
    options = {**options, "completion": {**options["completion"], "minChars": 7}}
    resolved = config.resolve(None, init_options=options, environ={})
    assert len(resolved.problems) == 1
    assert to_camel(bad_key) in resolved.problems[0]
    # The good key in the same layer survives; the bad one is the default.
    assert resolved.settings.completion.min_chars == 7
    default = config.Settings().completion
    if hasattr(default, bad_key):
        assert getattr(resolved.settings.completion, bad_key) == getattr(default, bad_key)


@pytest.mark.parametrize(
    ("user", "client", "expected"),
    [
        pytest.param(
            "",
            {"telemetry": {"backendUrl": "http://old", "token": "t", "level": "full"}},
            ("http://old", "t"),
            id="old-keys-moved",
        ),
        pytest.param(
            '[backend]\nurl = "http://new"\n',
            {"telemetry": {"backendUrl": "http://old"}},
            ("http://new", ""),
            id="the-new-key-wins",
        ),
    ],
)
def test_the_backend_section_and_its_old_keys(
    user_file: Path,
    user: str,
    client: dict[str, Any],
    expected: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    write(user_file, user)
    resolved = config.resolve(None, client_config=client, environ={}, user_file=user_file)
    settings = resolved.settings
    assert resolved.problems == []
    assert (settings.backend.url, settings.backend.token) == expected
    # The telemetry client sends where the backend section says.
    assert (settings.telemetry.backend_url, settings.telemetry.token) == expected
    assert "telemetry.backendUrl is deprecated" in caplog.text


def test_section_that_is_not_a_table() -> None:
    resolved = config.resolve(None, init_options={"completion": 5}, environ={})
    assert resolved.settings.completion == config.Settings().completion
    assert resolved.problems


def test_unreadable_workspace_file_is_reported(workspace: Path) -> None:
    write(workspace / "tabloop.toml", "this is [not toml")
    resolved = config.resolve(workspace, environ={})
    assert resolved.settings == config.Settings()
    assert any("tabloop.toml" in p for p in resolved.problems)


def test_init_options_not_an_object() -> None:
    resolved = config.resolve(None, init_options=["nope"], environ={})
    assert resolved.settings == config.Settings()
    assert resolved.problems


def test_readme_table_matches_the_model() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert config.readme_table(readme) == config.markdown_table(), (
        "README configuration table is stale: run `tabloop config --update-readme README.md`"
    )
