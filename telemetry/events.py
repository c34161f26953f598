"""The telemetry event schema, shared by the editor side and the training backend.

One versioned schema: every event carries `schema_version` and a `type` that selects its model.
Unknown fields are rejected on both sides, so a typo or a field that should not leave the machine
fails loudly instead of being stored. Strings that could carry code (`prompt`, `suggestion`) exist
only on decision events and are filled only at the opt-in privacy level `full`.

Every number is finite and bounded, and every time carries its UTC offset: the trainer does
arithmetic on these values (importance weights, shares, ages), so a value that no client makes
is refused here rather than found later as an overflow, an infinity or a naive-time TypeError.
How far a time may lie from the receiving server's clock is the backend's setting
(`backend/services/ingest.py`), not the schema's.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    model_validator,
)

# Version 2 added why a decision stayed silent, the client's name and version, and candidates
# (several suggestions for one request, each its own decision). Version 1 events are still accepted:
# every field version 2 added is optional and means "not known" when absent.
SCHEMA_VERSION: Literal[2] = 2
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
RETENTION_CHECKPOINTS_S: tuple[int, ...] = (30, 120, 600)
MAX_TEXT_CHARS = 32_768
MAX_FEATURES = 128
# Character and line counts: far above any suggestion or document a client sends, far below
# where arithmetic on them loses precision or overflows a float.
MAX_CHARS = 10_000_000
# Numeric feature values (lengths, seconds, rates, log-probabilities): the feature space clips
# each to a much smaller range; this only keeps squares and sums finite.
MAX_FEATURE_MAGNITUDE = 1e9

# `not_viewed`: a candidate the user never cycled to; it was not seen, so it was not ignored.
OutcomeKind = Literal["accepted", "partial", "ignored", "dismissed", "superseded", "not_viewed"]
IgnoredReason = Literal["diverged", "moved", "closed", "timeout"]
# Why a decision stayed silent: the policy chose to; the cleaned suggestion was empty; the
# suggestion could not arrive before the user's likely next keystroke (latency-aware skipping).
SilenceReason = Literal["policy", "empty", "latency"]
BASE_MODEL_VERSION = "base"
"""`model_version` of a decision the base model made, with no adapter."""
MAX_CANDIDATES = 10

# Identifiers we make ourselves (uuid hex, policy versions): short and free of spaces.
Token = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:+#/-]{1,128}$")]
# A category is a short lowercase word: a language id, a trigger, a token class.
Category = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+#-]{0,64}$")]
FeatureName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


# Every bound here is checked by pydantic's compiled validator, not by Python code per value: a
# Python check per feature value cost a tenth of an ingesting instance's CPU (profiled).
# `allow_inf_nan=False` refuses infinities and NaN, which JSON parsers accept as extensions.
Millis = Annotated[float, Field(ge=0, le=86_400_000, allow_inf_nan=False)]
Chars = Annotated[int, Field(ge=0, le=MAX_CHARS)]
# The probability the logging policy gave to the action it took: positive, since it was taken
# (a propensity of 0 would make the action's importance weight infinite).
Propensity = Annotated[float, Field(gt=0.0, le=1.0)]
MIN_PROPENSITY = 1e-6
"""The smallest propensity logged: a probability that rounded to 0 is logged as this."""
FeatureValue = Annotated[
    float, Field(ge=-MAX_FEATURE_MAGNITUDE, le=MAX_FEATURE_MAGNITUDE, allow_inf_nan=False)
]
Features = Annotated[dict[FeatureName, FeatureValue | Category], Field(max_length=MAX_FEATURES)]


def new_event_id() -> uuid.UUID:
    """A fresh client-made event id."""
    return uuid.uuid4()


def utc_now() -> datetime:
    return datetime.now(UTC)


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1, 2] = SCHEMA_VERSION
    event_id: uuid.UUID = Field(default_factory=new_event_id)
    # A naive time is refused, not read as UTC: the client always sends an offset, so a time
    # without one comes from something else, whose clock we cannot interpret.
    time: AwareDatetime = Field(default_factory=utc_now)


class Latency(BaseModel):
    """Where the time of one request went, in milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_ms: Millis = 0.0
    model_ms: Millis = 0.0
    total_ms: Millis = 0.0


class DecisionEvent(_Event):
    """The policy showed a suggestion or stayed silent."""

    type: Literal["decision"] = "decision"
    decision_id: Token
    session_id: Token
    install_id: Token
    language: Category
    trigger: Literal["automatic", "invoked"]
    policy_version: Token
    model_id: Annotated[str, StringConstraints(max_length=200)]
    action: Literal["show", "silence"]
    propensity: Propensity
    features: Features = Field(default_factory=dict)
    suggestion_chars: Chars = 0
    suggestion_lines: Chars = 0
    latency: Latency = Field(default_factory=Latency)
    cache_hit: bool = False
    # Only at privacy level `full`.
    prompt: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None
    suggestion: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None
    # Since version 2.
    silence_reason: SilenceReason | None = None
    client_name: Annotated[str, StringConstraints(max_length=64)] | None = None
    client_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    # Several candidates for one request: each is a decision of its own, sharing `request_id`,
    # with its place in the ranking (0 is the one shown first) and the count offered.
    request_id: Token | None = None
    rank: Annotated[int, Field(ge=0, lt=MAX_CANDIDATES)] = 0
    candidates: Annotated[int, Field(ge=1, le=MAX_CANDIDATES)] = 1
    # The adapter version that wrote the suggestion (`BASE_MODEL_VERSION`: none, the base model
    # alone), so a model canary is judged on its own decisions. Absent from older clients' events:
    # not known.
    model_version: Token | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DecisionEvent:
        if self.silence_reason is not None and self.action != "silence":
            raise ValueError("silence_reason is only for 'silence'")
        if self.rank >= self.candidates:
            raise ValueError("rank must be below candidates")
        return self


class OutcomeEvent(_Event):
    """What the user did with a shown suggestion."""

    type: Literal["outcome"] = "outcome"
    decision_id: Token
    kind: OutcomeKind
    accepted_chars: Chars | None = None
    reason: IgnoredReason | None = None
    time_to_outcome_ms: Millis = 0.0

    @model_validator(mode="after")
    def _kind_fields(self) -> OutcomeEvent:
        if self.kind in ("accepted", "partial") and self.accepted_chars is None:
            raise ValueError(f"'{self.kind}' needs accepted_chars")
        if self.kind not in ("accepted", "partial") and self.accepted_chars is not None:
            raise ValueError(f"'{self.kind}' takes no accepted_chars")
        if self.reason is not None and self.kind != "ignored":
            raise ValueError("reason is only for 'ignored'")
        return self


class RetentionEvent(_Event):
    """How much of an accepted suggestion is still in the document some time later."""

    type: Literal["retention"] = "retention"
    decision_id: Token
    after_s: Literal[30, 120, 600]
    accepted_chars: Chars
    retained_chars: Chars

    @model_validator(mode="after")
    def _bounded(self) -> RetentionEvent:
        if self.retained_chars > self.accepted_chars:
            raise ValueError("retained_chars exceeds accepted_chars")
        return self


NextEditKind = Literal["shown", "accepted", "rejected"]
NextEditRejectReason = Literal["dismissed", "typed", "moved"]


class NextEditEvent(_Event):
    """A predicted next edit the editor showed, and what the user did with it.

    One event when the editor shows it (`shown`), one when it is accepted or rejected; all of a
    prediction's events share its `decision_id`. Next edits are not decided by the gate, so
    these events are kept apart from decisions and outcomes (their own `type`) and no trainer of
    the gate reads them. `original` and `predicted` (the window before and after) only at `full`.
    """

    type: Literal["next_edit"] = "next_edit"
    decision_id: Token
    session_id: Token
    install_id: Token
    kind: NextEditKind
    reason: NextEditRejectReason | None = None
    language: Category
    trigger: Literal["automatic", "invoked"]
    model_id: Annotated[str, StringConstraints(max_length=200)]
    edits: Annotated[int, Field(ge=1, le=1000)]
    removed_chars: Chars = 0
    inserted_chars: Chars = 0
    window_lines: Chars = 0
    latency: Latency = Field(default_factory=Latency)
    time_to_outcome_ms: Millis = 0.0
    client_name: Annotated[str, StringConstraints(max_length=64)] | None = None
    client_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    # Only at privacy level `full`.
    original: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None
    predicted: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None

    @model_validator(mode="after")
    def _reason_for_rejections(self) -> NextEditEvent:
        if (self.reason is None) != (self.kind != "rejected"):
            raise ValueError("reason is for 'rejected', and 'rejected' needs one")
        return self


AnyEvent = DecisionEvent | OutcomeEvent | RetentionEvent | NextEditEvent
"""Every event type of the schema."""

Event = Annotated[AnyEvent, Field(discriminator="type")]
EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(Event)


def parse_event(data: object) -> AnyEvent:
    """Validate one event from decoded JSON; raises `pydantic.ValidationError`."""
    return EVENT_ADAPTER.validate_python(data)


class BatchMeta(BaseModel):
    """What a sender says about itself with a batch (`{"events": [...], "meta": {...}}`): its
    installation, how many events wait in its spool after this batch, and how many its spool
    has dropped since it was created. Optional; a backend that cannot read it ignores it."""

    model_config = ConfigDict(extra="forbid")

    install_id: Token
    spool_backlog: Annotated[int, Field(ge=0, le=2**53)]
    spool_dropped: Annotated[int, Field(ge=0, le=2**53)]


class Rejection(BaseModel):
    """One event of a batch the backend refused, and why."""

    model_config = ConfigDict(extra="forbid")

    index: int
    event_id: str | None = None
    error: str


class IngestResponse(BaseModel):
    """The backend's answer to `POST /v1/events`: the fate of each event of the batch."""

    model_config = ConfigDict(extra="forbid")

    accepted: list[str] = Field(default_factory=list)
    duplicate: list[str] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
