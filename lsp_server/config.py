"""The server's configuration: one typed, fully defaulted model, resolved from layers.

Layers, lowest first:

1. defaults (the models below);
2. the user file, `config.toml` in the platform's config directory;
3. the workspace: `tabloop.toml`, or `[tool.tabloop]` in `pyproject.toml`;
4. the environment: `TABLOOP_<FIELD>` for top-level fields, `TABLOOP_<SECTION>__<FIELD>` for
   section fields (`TABLOOP_COMPLETION__MAX_NEW_TOKENS=32`), and `TABLOOP_TELEMETRY=off`;
5. the client's `initializationOptions`;
6. the client's `workspace/configuration` (section `tabloop`), re-pulled on change.

Layers 1-4 are read by `common.config`, the same way for every command (`tabloop index` reads
the `index` section through them too); this module composes the server's full model from the
packages' section models and adds the client's layers. Keys may be camelCase or snake_case in
every layer. A bad value never stops the server: it is reported once, logged, and that key falls
back to its default while every other key keeps its value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, Field, model_validator
from pydantic.alias_generators import to_camel

from common import config as layered
from common.config import Layer, SharedSettings
from common.endpoint import MOVED_KEYS, BackendSection
from completion.next_edit.settings import NextEditSettings
from completion.policy_settings import PolicySettings
from completion.settings import CompletionSettings
from indexer.settings import IndexSettings
from telemetry.settings import TelemetrySettings
from training.settings import TrainingLoopSettings


class Settings(BackendSection, SharedSettings):
    """Everything a user can configure (`cacheDir` comes from `SharedSettings`, the `backend`
    section from `BackendSection`)."""

    log_level: Literal["error", "warning", "info", "debug"] = Field(
        "info", description="Least severe log level written to the log and the client."
    )
    max_message_bytes: int = Field(
        32 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "Largest LSP message body the server reads; a longer one is answered with an error"
            " and skipped."
        ),
    )
    completion: CompletionSettings = Field(default_factory=CompletionSettings)
    next_edit: NextEditSettings = Field(default_factory=NextEditSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    training: TrainingLoopSettings = Field(default_factory=TrainingLoopSettings)

    @model_validator(mode="after")
    def _telemetry_sends_to_the_backend(self) -> Settings:
        # The telemetry package's client takes its destination in its own settings; here it is
        # always the `backend` section's (`telemetry.backendUrl` itself moved there).
        self.telemetry = self.telemetry.model_copy(
            update={"backend_url": self.backend.url, "token": self.backend.token}
        )
        return self


Resolved: TypeAlias = layered.Resolved[Settings]


def validate_layers(layers: Iterable[Layer | None]) -> Resolved:
    """Merge layers in order and validate, dropping (and reporting) each bad key."""
    return layered.validate_layers(Settings, layers)


def resolve(
    workspace: Path | None = None,
    *,
    init_options: Any = None,
    client_config: Any = None,
    environ: Mapping[str, str] | None = None,
    user_file: Path | None = None,
) -> Resolved:
    """Settings for a workspace from every layer, the client's last."""
    return layered.resolve(
        Settings,
        workspace,
        above=[
            layered.client_layer("initializationOptions", init_options),
            layered.client_layer("workspace/configuration", client_config),
        ],
        environ=environ,
        user_file=user_file,
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
        if key in MOVED_KEYS:  # still read, moved to their new place, not listed
            continue
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
