"""Layered settings: how any entry point turns tabloop's configuration into its typed model.

Layers, lowest first:

1. defaults (the model's own);
2. the user file, `config.toml` in the platform's config directory (`common.paths`);
3. the workspace: `tabloop.toml`, or `[tool.tabloop]` in `pyproject.toml`;
4. the environment: `TABLOOP_<FIELD>` for top-level fields, `TABLOOP_<SECTION>__<FIELD>` for
   section fields (`TABLOOP_COMPLETION__MAX_NEW_TOKENS=32`), and `TABLOOP_TELEMETRY=off`;
5. whatever an entry point adds on top (the server: the client's `initializationOptions` and
   `workspace/configuration`; a command: its flags).

Keys may be camelCase, kebab-case or snake_case in every layer. A bad value never stops a
command: it is reported, and that key falls back to its default while every other key keeps its
value.

This module knows no section: each package keeps its own section model (`completion.settings`,
`indexer.settings`, ...), and each entry point composes the model it needs from them on top of
`SharedSettings`. The server's full model is `lsp_server.config.Settings`; `tabloop index`
composes only `cache_dir` and the `index` section, so the command and the server read the same
files the same way and build the same index.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel, to_snake

from common.machine import BFLOAT16_VARIABLE
from common.paths import APP_NAME, resolve_cache_dir, user_config_path

ENV_PREFIX = "TABLOOP_"
# Variables with our prefix that are not settings (test plumbing, paths of helper programs).
# Variables under the prefix that are not settings: the tests' own, and the CPU override.
ENV_IGNORED = ("TABLOOP_TEST_", BFLOAT16_VARIABLE)
# The training backend's own settings (`backend.settings`: `TABLOOP_BACKEND_<FIELD>`), not the
# client's; the client's `backend` section is `TABLOOP_BACKEND__<FIELD>`.
BACKEND_SERVER_ENV = "TABLOOP_BACKEND_"

# The camelCase-on-the-wire, unknown-keys-are-errors configuration of every settings model.
SETTINGS_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SharedSettings(BaseModel):
    """The top-level settings every entry point reads; section models are added by subclasses."""

    model_config = SETTINGS_CONFIG

    cache_dir: str = Field(
        "",
        description="Where models, indexes and the telemetry spool live; empty uses the "
        "platform's cache directory.",
    )

    def cache_path(self) -> Path:
        """The cache directory, created if needed (`common.paths.resolve_cache_dir`)."""
        return resolve_cache_dir(self.cache_dir)


ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass
class Layer:
    """One source of settings, as nested snake_case dicts."""

    name: str
    values: dict[str, Any]
    problems: list[str] = field(default_factory=list)


@dataclass
class Resolved(Generic[ModelT]):
    """Settings after layering, with what was wrong on the way."""

    settings: ModelT
    problems: list[str]
    layers: list[Layer]
    # Dotted snake_case keys whose values were bad and were dropped (they hold the default).
    dropped: list[str] = field(default_factory=list)

    def source_of(self, dotted_key: str) -> str:
        """Name of the highest layer that set `dotted_key` (`default` when none did, or when
        its value was bad and dropped)."""
        if any(dotted_key == key or dotted_key.startswith(key + ".") for key in self.dropped):
            return "default"
        for layer in reversed(self.layers):
            node: Any = layer.values
            for part in dotted_key.split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return layer.name
        return "default"


def normalize_keys(value: Any) -> Any:
    """camelCase or kebab-case keys to snake_case, recursively."""
    if isinstance(value, Mapping):
        return {to_snake(str(k).replace("-", "_")): normalize_keys(v) for k, v in value.items()}
    return value


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`; nested dicts merge, everything else replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping):
            # Copy nested tables, so that dropping a bad key later never edits a layer.
            base_table = merged.get(key)
            merged[key] = deep_merge(base_table if isinstance(base_table, dict) else {}, value)
        else:
            merged[key] = value
    return merged


def toml_layer(name: str, path: Path, table: tuple[str, ...] = ()) -> Layer | None:
    """The table `table` of the TOML file `path` (the whole file when empty); None if absent."""
    if not path.is_file():
        return None
    try:
        data: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return Layer(name, {}, [f"{path}: not read ({exc}); ignoring the file"])
    for key in table:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        return Layer(name, {}, [f"{path}: [{'.'.join(table)}] is not a table; ignoring it"])
    return Layer(name, normalize_keys(data)) if data else None


def user_layer(path: Path | None = None) -> Layer | None:
    """The user's `config.toml`."""
    return toml_layer("user", path or user_config_path())


def workspace_layer(root: Path | None) -> Layer | None:
    """`tabloop.toml` at the workspace root, else `[tool.tabloop]` in its `pyproject.toml`."""
    if root is None:
        return None
    own = toml_layer("workspace", root / "tabloop.toml")
    if own is not None:
        return own
    return toml_layer("workspace", root / "pyproject.toml", ("tool", "tabloop"))


def _parse_env_value(raw: str) -> Any:
    # JSON gives numbers, booleans and lists their types; anything else is a string.
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def env_layer(environ: Mapping[str, str] | None = None) -> Layer | None:
    """`TABLOOP_*` variables."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name.startswith(ENV_IGNORED):
            continue
        if name.startswith(BACKEND_SERVER_ENV) and not name.startswith(BACKEND_SERVER_ENV + "_"):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key == "telemetry":
            # `TABLOOP_TELEMETRY=off` is the documented one-word opt-out.
            values = deep_merge(values, {"telemetry": {"level": raw.strip().lower()}})
            continue
        path = key.split("__")
        node: dict[str, Any] = {path[-1]: _parse_env_value(raw)}
        for part in reversed(path[:-1]):
            node = {part: node}
        values = deep_merge(values, node)
    return Layer("environment", values) if values else None


def client_layer(name: str, options: Any) -> Layer | None:
    """Settings an editor sends (`initializationOptions`, a `workspace/configuration` result)."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        return Layer(name, {}, [f"{name}: expected an object, got {type(options).__name__}"])
    # Clients commonly wrap settings in their section name.
    if set(options) == {APP_NAME}:
        options = options[APP_NAME]
        if not isinstance(options, Mapping):
            return Layer(name, {}, [f"{name}: expected an object under '{APP_NAME}'"])
    return Layer(name, normalize_keys(options)) if options else None


def flag_layer(values: Mapping[str, Any]) -> Layer | None:
    """A command's flags, as a layer above every file: pass only the flags the user gave."""
    return Layer("command line", normalize_keys(values)) if values else None


def _remove_key(values: dict[str, Any], loc: tuple[int | str, ...], dropped: list[str]) -> bool:
    node: Any = values
    for part in loc[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        dropped.append(".".join(str(part) for part in loc))
        return True
    return False


def _describe(error: Any) -> str:
    loc = ".".join(to_camel(str(p)) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown setting '{loc}'; ignoring it"
    return (
        f"invalid value for '{loc}' ({error['msg']}, got {error.get('input')!r}); using the default"
    )


def validate_layers(
    model: type[ModelT], layers: Iterable[Layer | None], *, ignore_other_keys: bool = False
) -> Resolved[ModelT]:
    """Merge layers in order and validate them as `model`, dropping (and reporting) each bad key.

    With `ignore_other_keys`, top-level keys that `model` does not declare are left out without
    a word: they belong to other entry points' models (the server's `completion` section is no
    concern of `tabloop index`), and the server, which reads every key, reports the unknown ones.
    """
    present = [layer for layer in layers if layer is not None]
    merged: dict[str, Any] = {}
    problems: list[str] = []
    dropped: list[str] = []
    for layer in present:
        problems.extend(layer.problems)
        merged = deep_merge(merged, layer.values)
    if ignore_other_keys:
        merged = {key: value for key, value in merged.items() if key in model.model_fields}
    for _ in range(100):  # each round removes at least one key, so this ends
        try:
            settings = model.model_validate(merged)
            break
        except ValidationError as exc:
            removed = False
            for error in exc.errors():
                problems.append(_describe(error))
                removed |= _remove_key(merged, error["loc"], dropped)
            if not removed:
                # A section that is not a table at all: drop the whole section.
                for error in exc.errors():
                    removed |= _remove_key(merged, error["loc"][:1], dropped)
            if not removed:
                settings = model.model_validate({})
                dropped = list(merged)
                problems.append("configuration could not be repaired; using defaults")
                break
    else:  # pragma: no cover - defensive: more than 100 bad keys
        settings = model.model_validate({})
        dropped = list(merged)
    return Resolved(settings, problems, present, dropped)


def resolve(
    model: type[ModelT],
    workspace: Path | None = None,
    *,
    above: Sequence[Layer | None] = (),
    environ: Mapping[str, str] | None = None,
    user_file: Path | None = None,
    ignore_other_keys: bool = False,
) -> Resolved[ModelT]:
    """`model` for a workspace from the user file, the workspace, the environment, then `above`.

    `above` are the entry point's own layers, lowest first (a client's options, a command's
    flags). `environ` defaults to `os.environ`, `user_file` to `common.paths.user_config_path()`.
    """
    return validate_layers(
        model,
        [user_layer(user_file), workspace_layer(workspace), env_layer(environ), *above],
        ignore_other_keys=ignore_other_keys,
    )


def configured_cache_dir(workspace: Path | None = None) -> Path:
    """The cache directory the configuration names (`cacheDir` in any file or environment
    layer), else the default; created if needed. For commands that read no other setting."""
    return resolve(SharedSettings, workspace, ignore_other_keys=True).settings.cache_path()
