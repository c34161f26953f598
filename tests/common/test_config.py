"""The model-agnostic layered resolution in `common.config`, on a model of the test's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from common import config


class Section(BaseModel):
    model_config = config.SETTINGS_CONFIG

    size: int = Field(1, ge=1)
    names: list[str] = Field(default_factory=list)


class Composed(config.SharedSettings):
    """What one entry point reads: `cacheDir` and one section."""

    section: Section = Field(default_factory=Section)


def resolve(tmp_path: Path, workspace: str, **kwargs: Any) -> config.Resolved[Composed]:
    (tmp_path / "tabloop.toml").write_text(workspace, encoding="utf-8")
    kwargs.setdefault("environ", {})
    return config.resolve(Composed, tmp_path, user_file=tmp_path / "absent.toml", **kwargs)


@pytest.mark.parametrize(
    ("workspace", "kwargs", "expected", "source", "problems"),
    [
        pytest.param("[section]\nsize = 3\n", {}, 3, "workspace", 0, id="workspace"),
        pytest.param(
            "[section]\nsize = 3\n",
            {"environ": {"TABLOOP_SECTION__SIZE": "4"}},
            4,
            "environment",
            0,
            id="environment-over-workspace",
        ),
        pytest.param(
            "[section]\nsize = 3\n",
            {
                "environ": {"TABLOOP_SECTION__SIZE": "4"},
                "above": [config.flag_layer({"section": {"size": 5}})],
            },
            5,
            "command line",
            0,
            id="flags-over-environment",
        ),
        pytest.param(
            "[section]\nsize = 0\nnames = ['a']\n", {}, 1, "default", 1, id="bad-value-default"
        ),
        pytest.param(
            "[section]\nsize = 3\n[other]\nx = 1\n",
            {"ignore_other_keys": True},
            3,
            "workspace",
            0,
            id="other-sections-ignored",
        ),
        pytest.param(
            "[section]\nsize = 3\n[other]\nx = 1\n", {}, 3, "workspace", 1, id="unknown-reported"
        ),
    ],
)
def test_layers(
    workspace: str,
    kwargs: dict[str, Any],
    expected: int,
    source: str,
    problems: int,
    tmp_path: Path,
) -> None:
    resolved = resolve(tmp_path, workspace, **kwargs)
    assert isinstance(resolved.settings, Composed)
    assert resolved.settings.section.size == expected
    assert resolved.source_of("section.size") == source
    assert len(resolved.problems) == problems, resolved.problems


def test_a_dropped_value_leaves_its_layer_as_read(tmp_path: Path) -> None:
    resolved = resolve(tmp_path, "[section]\nsize = 0\nnames = ['a']\n")
    assert resolved.layers[0].values == {"section": {"size": 0, "names": ["a"]}}
    assert resolved.source_of("section.names") == "workspace"
    assert resolved.source_of("section.size") == "default"


def test_kebab_and_camel_keys_in_files(tmp_path: Path) -> None:
    resolved = resolve(tmp_path, 'cache-dir = "/c"\n[section]\nnames = ["x"]\n')
    assert resolved.settings.cache_dir == "/c"
    assert resolved.settings.section.names == ["x"]


def test_no_flags_no_layer() -> None:
    assert config.flag_layer({}) is None


def test_cache_path_follows_the_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(tmp_path / "from-env"))
    assert Composed().cache_path() == tmp_path / "from-env"
    configured = Composed(cache_dir=str(tmp_path / "configured"))
    assert configured.cache_path() == tmp_path / "configured"
    assert configured.cache_path().is_dir()


def test_configured_cache_dir_reads_the_user_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TABLOOP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    user_file = tmp_path / "xdg" / "tabloop" / "config.toml"
    user_file.parent.mkdir(parents=True)
    # Another command's section, even a bad one, is no concern of a command that needs a path.
    configured = tmp_path / "configured"
    user_file.write_text(f'cacheDir = "{configured}"\n[completion]\nrunner = 5\n', encoding="utf-8")
    assert config.configured_cache_dir() == configured
    assert configured.is_dir()
