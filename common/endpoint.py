"""The `backend` section: the training backend that the client's features share.

Telemetry sends its events there, the policy client and the adapter fetcher pull from it, and
index sync pushes and fetches vectors: one address and one tenant token for all four
(`backend.url`, `backend.token`). They used to live in the telemetry section
(`telemetry.backendUrl`, `telemetry.token`); those keys are still read, moved to this section
before validation with a note in the log, so existing editor settings and files keep working.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel, to_snake

log = logging.getLogger(__name__)

# Old dotted camelCase key -> its new place. Not contributed to editors or the README.
MOVED_KEYS = {"telemetry.backendUrl": "backend.url", "telemetry.token": "backend.token"}


class BackendEndpoint(BaseModel):
    """Where the training backend is, and the tenant token to give it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    url: str = Field(
        "",
        description="Base URL of the training backend (`http://127.0.0.1:8765`), shared by "
        "telemetry, the policy client, the adapter fetcher and index sync; empty keeps events "
        "in the local spool and fetches nothing.",
    )
    token: str = Field(
        "", description="Bearer token of the tenant, from `tabloop backend token create`."
    )


def _section(data: dict[str, Any], name: str) -> tuple[str, dict[str, Any]] | None:
    """The key and table of section `name` in raw settings (any key spelling)."""
    for key, value in data.items():
        if to_snake(key.replace("-", "_")) == name and isinstance(value, dict):
            return key, value
    return None


def move_old_backend_keys(data: Any) -> Any:
    """Raw settings with `telemetry.backendUrl`/`telemetry.token` moved to `backend.url` and
    `backend.token` (a value under the new name wins); logs a deprecation note for each."""
    if not isinstance(data, dict):
        return data
    telemetry = _section(data, "telemetry")
    if telemetry is None:
        return data
    telemetry_key, old = telemetry
    moved = {
        key: to_snake(key.replace("-", "_"))
        for key in old
        if to_snake(key.replace("-", "_")) in ("backend_url", "token")
    }
    if not moved:
        return data
    data = dict(data)
    kept = {key: value for key, value in old.items() if key not in moved}
    data[telemetry_key] = kept
    backend = _section(data, "backend")
    backend_key, new = backend if backend is not None else ("backend", {})
    new = dict(new)
    for key, name in moved.items():
        field = "url" if name == "backend_url" else "token"
        old_key = f"telemetry.{to_camel(name)}"
        if field in new:
            log.warning(
                "configuration: %s is deprecated and ignored: backend.%s is set", old_key, field
            )
            continue
        new[field] = old[key]
        log.warning("configuration: %s is deprecated; use %s", old_key, MOVED_KEYS[old_key])
    data[backend_key] = new
    return data


class BackendSection(BaseModel):
    """A settings model with the `backend` section (and the old keys moved into it)."""

    backend: BackendEndpoint = Field(default_factory=BackendEndpoint)

    @model_validator(mode="before")
    @classmethod
    def _old_backend_keys(cls, data: Any) -> Any:
        return move_old_backend_keys(data)
