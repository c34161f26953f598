"""Privacy levels: what each level lets leave the machine.

`off` records nothing. `metrics` (the default) keeps numbers and categories and strips everything
that could carry code, paths or identifiers. `full` is an explicit opt-in that adds the prompt and
suggestion text. The checks here are the last line before the spool; the producers of events are
expected to send only numbers and categories already.
"""

from __future__ import annotations

import hashlib
import re

from telemetry.events import AnyEvent, DecisionEvent, NextEditEvent
from telemetry.settings import Level

# A category at `metrics` is a lowercase word such as a language id or a token class. Anything
# else (mixed case, digits runs that look like names, punctuation) could be an identifier taken
# from the user's code, so it is replaced.
_CATEGORY = re.compile(r"^[a-z][a-z0-9_+#.-]{0,31}$")
REDACTED = "other"


def effective_level(configured: Level, client_enabled: bool) -> Level:
    """The level in force: the configured one, unless the editor says telemetry is off."""
    return configured if client_enabled else "off"


def scrub_features(features: dict[str, float | str]) -> dict[str, float | str]:
    """Numbers pass; strings pass only when they look like a category, else become `other`."""
    clean: dict[str, float | str] = {}
    for key, value in features.items():
        if isinstance(value, int | float):  # bool is an int
            clean[key] = float(value)
        else:
            clean[key] = value if _CATEGORY.match(value) else REDACTED
    return clean


def scrub_model_id(model_id: str) -> str:
    """A hub model id passes; a local path is replaced by a short digest of it."""
    looks_like_path = (
        model_id.startswith(("/", "~", ".", "\\"))
        or ":\\" in model_id
        or model_id.count("/") > 1
        or model_id.endswith(".gguf")
    )
    if not looks_like_path:
        return model_id[:200]
    return "local:" + hashlib.sha256(model_id.encode()).hexdigest()[:12]


def apply_level(event: AnyEvent, level: Level) -> AnyEvent | None:
    """The event as `level` allows it to be recorded, or None when nothing may be recorded."""
    if level == "off":
        return None
    if level == "full":
        return event
    if isinstance(event, NextEditEvent):
        scrubbed = scrub_model_id(event.model_id)
        if event.original is None and event.predicted is None and scrubbed == event.model_id:
            return event
        return event.model_copy(update={"original": None, "predicted": None, "model_id": scrubbed})
    if not isinstance(event, DecisionEvent):
        return event
    scrubbed_features = scrub_features(event.features)
    scrubbed_model = scrub_model_id(event.model_id)
    if (
        event.prompt is None
        and event.suggestion is None
        and scrubbed_features == event.features
        and scrubbed_model == event.model_id
    ):
        return event  # the common case costs no copy
    return event.model_copy(
        update={
            "prompt": None,
            "suggestion": None,
            "features": scrubbed_features,
            "model_id": scrubbed_model,
        }
    )
