"""tabloop's configuration: one typed, fully defaulted model, resolved from layers.

Layers, lowest first:

1. defaults (the models below);
2. the user file, `config.toml` in the platform's config directory;
3. the workspace: `tabloop.toml`, or `[tool.tabloop]` in `pyproject.toml`;
4. the environment: `TABLOOP_<FIELD>` for top-level fields, `TABLOOP_<SECTION>__<FIELD>` for
   section fields (`TABLOOP_COMPLETION__MAX_NEW_TOKENS=32`), and `TABLOOP_TELEMETRY=off`;
5. the client's `initializationOptions`;
6. the client's `workspace/configuration` (section `tabloop`), re-pulled on change.

Keys may be camelCase or snake_case in every layer. A bad value never stops the server: it is
reported once, logged, and that key falls back to its default while every other key keeps its
value.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel, to_snake

from completion.policy_settings import PolicySettings
from completion.settings import CompletionSettings
from indexer.settings import IndexSettings
from telemetry.settings import TelemetrySettings

APP_NAME = "tabloop"
ENV_PREFIX = "TABLOOP_"
# Variables with our prefix that are not settings (test plumbing, paths of helper programs).
ENV_IGNORED = ("TABLOOP_TEST_",)


class Settings(BaseModel):
    """Everything a user can configure."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    cache_dir: str = Field(
        "",
        description="Where models, indexes and the telemetry spool live; empty uses the "
        "platform's cache directory.",
    )
    log_level: Literal["error", "warning", "info", "debug"] = Field(
        "info", description="Least severe log level written to the log and the client."
    )
    completion: CompletionSettings = Field(default_factory=CompletionSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)

    def cache_path(self) -> Path:
        """The cache directory, created if needed."""
        path = Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        return path


def default_cache_dir() -> Path:
    return platformdirs.user_cache_path(APP_NAME)


def user_config_path() -> Path:
    return platformdirs.user_config_path(APP_NAME) / "config.toml"


@dataclass
class Layer:
    """One source of settings, as nested snake_case dicts."""

    name: str
    values: dict[str, Any]
    problems: list[str] = field(default_factory=list)


@dataclass
class Resolved:
    """Settings after layering, with what was wrong on the way."""

    settings: Settings
    problems: list[str]
    layers: list[Layer]

    def source_of(self, dotted_key: str) -> str:
        """Name of the highest layer that set `dotted_key` (`default` when none did)."""
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
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _toml_layer(name: str, path: Path, table: tuple[str, ...] = ()) -> Layer | None:
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
    return _toml_layer("user", path or user_config_path())


def workspace_layer(root: Path | None) -> Layer | None:
    """`tabloop.toml` at the workspace root, else `[tool.tabloop]` in its `pyproject.toml`."""
    if root is None:
        return None
    own = _toml_layer("workspace", root / "tabloop.toml")
    if own is not None:
        return own
    return _toml_layer("workspace", root / "pyproject.toml", ("tool", "tabloop"))


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
    """`initializationOptions` or a `workspace/configuration` result."""
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


def _remove_key(values: dict[str, Any], loc: tuple[int | str, ...]) -> bool:
    node: Any = values
    for part in loc[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def _describe(error: Any, merged: dict[str, Any]) -> str:
    loc = ".".join(to_camel(str(p)) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown setting '{loc}'; ignoring it"
    return (
        f"invalid value for '{loc}' ({error['msg']}, got {error.get('input')!r}); using the default"
    )


def validate_layers(layers: Iterable[Layer | None]) -> Resolved:
    """Merge layers in order and validate, dropping (and reporting) each bad key."""
    present = [layer for layer in layers if layer is not None]
    merged: dict[str, Any] = {}
    problems: list[str] = []
    for layer in present:
        problems.extend(layer.problems)
        merged = deep_merge(merged, layer.values)
    for _ in range(100):  # each round removes at least one key, so this ends
        try:
            settings = Settings.model_validate(merged)
            break
        except ValidationError as exc:
            removed = False
            for error in exc.errors():
                problems.append(_describe(error, merged))
                removed |= _remove_key(merged, error["loc"])
            if not removed:
                # A section that is not a table at all: drop the whole section.
                for error in exc.errors():
                    removed |= _remove_key(merged, error["loc"][:1])
            if not removed:
                settings = Settings()
                problems.append("configuration could not be repaired; using defaults")
                break
    else:  # pragma: no cover - defensive: more than 100 bad keys
        settings = Settings()
    return Resolved(settings, problems, present)


def resolve(
    workspace: Path | None = None,
    *,
    init_options: Any = None,
    client_config: Any = None,
    environ: Mapping[str, str] | None = None,
    user_file: Path | None = None,
) -> Resolved:
    """Settings for a workspace from every layer."""
    return validate_layers(
        [
            user_layer(user_file),
            workspace_layer(workspace),
            env_layer(environ),
            client_layer("initializationOptions", init_options),
            client_layer("workspace/configuration", client_config),
        ]
    )


def settings_rows(
    model: type[BaseModel] = Settings, prefix: str = ""
) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every leaf setting, in declaration order."""
    rows: list[tuple[str, str, str, str]] = []
    properties = model.model_json_schema()["properties"]
    for name, info in model.model_fields.items():
        annotation = info.annotation
        key = f"{prefix}{to_camel(name)}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(settings_rows(annotation, f"{key}."))
            continue
        schema = properties[to_camel(name)]
        kind = _kind(schema)
        default = info.get_default(call_default_factory=True)
        rows.append((key, kind, json.dumps(default, default=str), info.description or ""))
    return rows


def _kind(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_kind(option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_kind(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def markdown_table() -> str:
    """The README's configuration table."""
    lines = [
        "| setting | type | default | description |",
        "|---|---|---|---|",
    ]
    for key, kind, default, description in settings_rows():
        lines.append(f"| `{key}` | {kind} | `{default}` | {description} |")
    return "\n".join(lines) + "\n"


TABLE_BEGIN = "<!-- config-table:begin -->\n"
TABLE_END = "<!-- config-table:end -->"


def readme_table(readme: str) -> str:
    """The configuration table currently between the markers of a README."""
    if TABLE_BEGIN not in readme or TABLE_END not in readme:
        raise ValueError("the README has no configuration table markers")
    return readme.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]


def update_readme(path: Path) -> bool:
    """Rewrite the README's configuration table from the model; True when it changed."""
    readme = path.read_text(encoding="utf-8")
    current = readme_table(readme)
    fresh = markdown_table()
    if current == fresh:
        return False
    path.write_text(readme.replace(TABLE_BEGIN + current, TABLE_BEGIN + fresh, 1), encoding="utf-8")
    return True
