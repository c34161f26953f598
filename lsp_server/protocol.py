"""tabloop's own LSP surface: method and command names, with their parameter and result types.

The one source of these names. The server's features import them from here; the editors get
them generated (`editors/vscode/src/protocol.ts`, `editors/neovim/lua/tabloop/protocol.lua`, by
`editors/vscode/scripts/gen_protocol.py`), and a test fails when a generated file drifts. Every
upper-case string constant of this module is a name the editors receive.

Parameters are attrs classes, as in lsprotocol, so lsprotocol's converter reads and writes them
with camelCase keys; results that are plain JSON trees (status, timings) are TypedDicts.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, TypedDict, TypeVar

import attrs
from lsprotocol import converters, types

log = logging.getLogger(__name__)

# -- names --------------------------------------------------------------------------------------

CONFIGURATION_SECTION = "tabloop"
"""The `workspace/configuration` section, and the key of `didChangeConfiguration` settings."""

ACCEPT_COMMAND = "tabloop.accept"
"""`workspace/executeCommand`, arguments `[decisionId]`: the editor inserted a suggestion."""

STATUS_REQUEST = "tabloop/status"
"""No parameters; answers a `ServerStatus`."""

TIMINGS_REQUEST = "tabloop/timings"
"""No parameters; answers the recent `RequestTiming`s, oldest first (for benchmarks): one for
every completion request, however it ended, named by the request's JSON-RPC id."""

SEARCH_REQUEST = "tabloop/search"
"""`SearchParams`; answers `SearchHit`s, best first."""

DID_SHOW_NOTIFICATION = "tabloop/didShow"
"""`DecisionParams`: the editor displayed a suggestion."""

DID_DISMISS_NOTIFICATION = "tabloop/didDismiss"
"""`DecisionParams`: the user dismissed a suggestion."""

TELEMETRY_ENABLED_NOTIFICATION = "tabloop/telemetryEnabled"
"""`TelemetryEnabledParams`: the editor's own telemetry switch changed."""

NEXT_EDIT_REQUEST = "textDocument/copilotInlineEdit"
"""`NextEditParams`; answers `{"edits": [NextEditItem, ...]}` (`[]`: no change). Copilot's name, so
clients that render Copilot's next edits work unchanged."""

TABLOOP_NEXT_EDIT_REQUEST = "tabloop/nextEdit"
"""The same request as `NEXT_EDIT_REQUEST`, under tabloop's own name."""

DID_SHOW_INLINE_EDIT_NOTIFICATION = "textDocument/didShowInlineEdit"
"""`NextEditShownParams` (`{"item": NextEditItem}`): the editor displayed a predicted edit."""

NEXT_EDIT_SHOWN_NOTIFICATION = "tabloop/nextEditShown"
"""The same notification as `DID_SHOW_INLINE_EDIT_NOTIFICATION`, under tabloop's own name."""

NEXT_EDIT_REJECTED_NOTIFICATION = "tabloop/nextEditRejected"
"""`NextEditRejectedParams` (`{"id": ..., "reason": "dismissed" | "typed" | "moved"}`)."""

ACCEPT_NEXT_EDIT_COMMAND = "tabloop.acceptNextEdit"
"""`workspace/executeCommand`, arguments `[id]`: the editor applied a predicted edit's items."""

ACCEPT_NEXT_EDIT_TITLE = "Accept next edit"

NEXT_EDIT_TIMINGS_REQUEST = "tabloop/nextEditTimings"
"""No parameters; answers the recent `NextEditTiming`s, oldest first (for benchmarks)."""

NEXT_EDIT_CAPABILITY = "nextEdit"
"""`capabilities.experimental.tabloop.nextEdit`: true when the server predicts next edits."""

MODEL_PROGRESS_TITLE = "tabloop"
"""Title of the `$/progress` while the completion model loads."""

INDEX_PROGRESS_TITLE = "tabloop index"
"""Title of the `$/progress` while the workspace index scans and embeds."""

ADAPTER_PROGRESS_TITLE = "tabloop adapter"
"""Title of the `$/progress` while the fast engine merges and converts a promoted adapter."""

TRAINING_PROGRESS_TITLE = "tabloop training"
"""Title of the `$/progress` of a training run the server started by itself (steps, judging, the
outcome)."""

MODEL_PROGRESS_TOKEN_PREFIX = "tabloop-model-"
INDEX_PROGRESS_TOKEN_PREFIX = "tabloop-index-"
ADAPTER_PROGRESS_TOKEN_PREFIX = "tabloop-adapter-"
TRAINING_PROGRESS_TOKEN_PREFIX = "tabloop-training-"

SEARCH_K_DEFAULT = 10
SEARCH_K_MAX = 100

# -- parameters ---------------------------------------------------------------------------------


@attrs.define
class DecisionParams:
    """`tabloop/didShow` and `tabloop/didDismiss`: `{"decisionId": ...}`."""

    decision_id: str


@attrs.define
class TelemetryEnabledParams:
    """`tabloop/telemetryEnabled`: `{"enabled": bool}`."""

    enabled: bool


@attrs.define
class SearchParams:
    """`tabloop/search`: `{"query": ..., "k": ...}`; both may be missing or null."""

    query: str | None = None
    k: int | None = None

    def text(self) -> str:
        return self.query or ""

    def limit(self) -> int:
        """How many hits to answer: `k`, else `SEARCH_K_DEFAULT`, within 1..`SEARCH_K_MAX`."""
        return max(1, min(self.k or SEARCH_K_DEFAULT, SEARCH_K_MAX))


@attrs.define
class NextEditContext:
    """`context` of a next-edit request: 1 invoked, 2 automatic (as inline completion's)."""

    trigger_kind: int = 2


@attrs.define
class NextEditParams:
    """`textDocument/copilotInlineEdit` and `tabloop/nextEdit`."""

    text_document: types.VersionedTextDocumentIdentifier
    position: types.Position
    context: NextEditContext | None = None


@attrs.define
class NextEditItemId:
    """The part of a shown item the server reads back: its prediction's id."""

    id: str


@attrs.define
class NextEditShownParams:
    """`textDocument/didShowInlineEdit` and `tabloop/nextEditShown`: `{"item": {"id": ...}}`;
    only the item's id is read."""

    item: NextEditItemId


@attrs.define
class NextEditRejectedParams:
    """`tabloop/nextEditRejected`."""

    id: str
    reason: Literal["dismissed", "typed", "moved"] = "dismissed"


# -- results ------------------------------------------------------------------------------------


@attrs.define
class NextEditItem:
    """One edit of a prediction; every item of an answer shares the prediction's `id`."""

    id: str
    text_document: types.VersionedTextDocumentIdentifier
    range: types.Range
    text: str
    command: types.Command


@attrs.define
class NextEditResult:
    """The answer to a next-edit request: `edits: []` means no change."""

    edits: list[NextEditItem] = attrs.field(factory=list)


@attrs.define
class SearchHit:
    """One `tabloop/search` hit: a chunk of a file, its score and a preview."""

    uri: str
    range: types.Range
    score: float
    preview: str
    symbols: list[str] = attrs.field(factory=list)


RequestOutcome = Literal[
    "shown",  # a suggestion went back to the editor
    "silenced",  # the gate chose silence
    "empty",  # nothing worth showing (`Decision.reason` says why)
    "latency_skip",  # answered empty at once: the suggestion would have come too late
    "cancelled",  # `$/cancelRequest` (the next keystroke) or a newer request took over
    "stale",  # the document moved on while the model ran
    "not_ready",  # no model yet, or completion is turned off
    "no_document",  # a document the editor never opened
    "error",  # the handler failed (logged) and answered empty
]
"""How one completion request ended, as `RequestTiming.outcome` reports it."""


class RequestTiming(TypedDict):
    """One completion request, however it ended: wall times, prompt sizes, what was decided why.

    A request has exactly one record, its own (`request_id`), written when its handler ends: a
    request that was cancelled or went stale is recorded as such, never left to be read off
    another request's record. Fields a request never reached are zero or empty."""

    request_id: str  # the JSON-RPC id of the request, as a string
    outcome: RequestOutcome
    reached_model: bool  # the model (or its cache) was asked: `complete` ran and did not defer
    handler_ms: float
    wait_ms: float  # waiting for the user's pause to turn out long enough (latency skipping)
    model_ms: float
    context_ms: float
    prompt_tokens: float
    prefill_tokens: float
    prefill_ms: float  # in the runner: reading the prompt (to the first token)
    decode_ms: float  # in the runner: the tokens after the first
    new_tokens: float
    cache_hit: float
    cache_source: str  # "typing", "prefetch", or "" for a model call
    candidates: int
    retrieval_found: float
    action: str
    reason: str
    # A latency skip's reasons: the predicted time to the first token and the likely rest of
    # the pause it exceeded, in milliseconds (zero for other outcomes).
    predicted_ms: float
    likely_pause_ms: float


NextEditOutcome = Literal[
    "shown",  # edits went back to the editor
    "no_change",  # the answer was no change (`reason` says why, and whether the model ran)
    "refused",  # the model's rewrite was refused by a guard (`reason`: which)
    "cancelled",  # `$/cancelRequest`, a newer request, or an edit to the document
    "stale",  # the request named an old version, or the document moved on meanwhile
    "not_ready",  # no model yet, or next edits are turned off
    "no_document",  # a document the editor never opened
    "error",  # the handler failed (logged) and answered no change
]
"""How one next-edit request ended, as `NextEditTiming.outcome` reports it."""


class NextEditTiming(TypedDict):
    """One next-edit request, however it ended (`tabloop/nextEditTimings`)."""

    request_id: str
    outcome: NextEditOutcome
    reason: str  # the predictor's reason (`completion.next_edit.predictor.Reason`), or ""
    reached_model: bool
    handler_ms: float
    window_ms: float
    screen_ms: float
    screen: float | None  # the screen's chance of an edit in the window (None: not asked)
    prompt_ms: float
    model_ms: float
    diff_ms: float
    window_lines: int
    window_tokens: int
    prompt_tokens: int
    cached_tokens: int  # of them, kept by the runner from before (a pre-read): not computed
    new_tokens: int
    draft_tokens: int
    draft_accepted: int
    reused: bool  # answered with a rewrite kept from the same prompt (a prefetch), no model call
    edits: int


class ModelStatus(TypedDict):
    state: str
    modelId: str
    error: str
    calls: int
    prefillTokens: int
    typingCacheHits: int
    jobs: int  # model-thread jobs queued or running (0: idle)


class ServerStatus(TypedDict, total=False):
    """`tabloop/status`; features add their own parts (`index`, `sync`, `context`, `training`)."""

    version: str
    model: ModelStatus
    policy: dict[str, Any]
    telemetry: dict[str, Any]
    decisions: dict[str, int]
    index: dict[str, Any]
    sync: dict[str, Any]
    context: dict[str, Any]
    training: dict[str, Any]


# -- reading parameters -------------------------------------------------------------------------

P = TypeVar("P")


def _strict(kind: type[Any]) -> Any:
    # lsprotocol's converter coerces (5 -> "5", "no" -> True); a malformed message is ignored
    # instead, as it was before the types existed.
    def structure(value: Any, _type: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return structure


_converter = converters.get_converter()
for _kind in (str, bool, int):
    _converter.register_structure_hook(_kind, _strict(_kind))


def plain(value: Any) -> Any:
    """JSON-like data from what pygls hands a custom method: namedtuples become dicts."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def read_params(params: Any, kind: type[P]) -> P | None:
    """`params` of a custom method as `kind`, or None when they do not fit (logged).

    pygls does not know our methods' types, so it hands over namedtuples (or dicts, from other
    transports); a client sending something else must not break the server.
    """
    try:
        return _converter.structure(plain(params) or {}, kind)
    except Exception:
        log.debug("ignoring malformed %s: %r", kind.__name__, params, exc_info=True)
        return None


def to_wire(value: Any) -> Any:
    """A result as JSON-ready data, with lsprotocol's camelCase keys."""
    return _converter.unstructure(value)
