"""One definition of the session: a scripted session played by the replay and told to the server.

The replay's `EditingSession` and the language server's own objects (the inline feature's
`TypingTracker`, the telemetry feature with its outcome tracker and `decision_event`) are given
the same session: the same keystrokes at the same (simulated) times, the same suggestions, the
same user reactions. The gate must see identical feature vectors, and the backend must receive
identical events, from both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from completion import gate
from completion.engine import Engine
from completion.session import SessionSignals
from completion.settings import CompletionSettings
from completion.types import CompletionRequest, Decision
from evaluation.editing import SECONDS_PER_CHAR, SETTLE_S, EditingSession
from evaluation.simulation import Position, UserResponse, simulated_user
from lsp_server.documents import adopt
from lsp_server.features.inline import TypingTracker
from lsp_server.features.telemetry import TelemetryFeature
from lsp_server.outcomes import TextChange
from lsp_server.server import TabloopServer
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent
from tests.support.scripted_model import ScriptedModel

PATH = "/work/example.py"
URI = Path(PATH).as_uri()
TEXT = (
    "import math\n\n\n"
    "def area(width, height):\n"
    "    return width * height\n\n\n"
    "def volume(w, h, d):\n"
    "    return area(w, h) * d\n\n\n"
    "def circle(r):\n"
    "    return math.pi * r * r\n"
)
# Where the user stops, and what the model says there: accepted, taken in part by word,
# accepted, ignored.
CURSORS = [
    ("def area(width, height):\n    return ", "width * height"),
    ("def volume(", "w, h):"),
    ("def volume(w, h, d):\n    return ", "area(w, h) * d"),
    ("def circle(r):\n    return ", "None"),
]
WINDOW_CHARS = int(10 / SECONDS_PER_CHAR)


def positions() -> list[Position]:
    found = []
    for marker, _ in CURSORS:
        offset = TEXT.index(marker) + len(marker)
        line = TEXT.count("\n", 0, offset)
        column = offset - (TEXT.rfind("\n", 0, offset) + 1)
        found.append(Position(PATH, TEXT[:offset], TEXT[offset:], "python", line, column))
    return found


def engine() -> Engine:
    model = ScriptedModel(rules={marker: answer for marker, answer in CURSORS})
    settings = CompletionSettings(model="scripted", max_new_tokens=32, cache=False)
    always = gate.builtin_policy().with_floor(1.0)
    return Engine(settings, model, policy_source=lambda: always, seed=1)


class Recorder:
    """The telemetry client's part the feature uses: who it is, its level, `record`."""

    def __init__(self) -> None:
        self.level = "metrics"
        self.session_id = "session"
        self.install_id = "install"
        self.events: list[Any] = []

    def record(self, event: Any) -> None:
        self.events.append(event)


class ServerSide:
    """The language server's session objects, driven by LSP document changes on a fake clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ls = TabloopServer()
        next(
            self.ls.protocol.lsp_initialize(
                types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=None)
            ),
            None,
        )
        self.session = self.ls.add_feature(SessionSignals(clock=lambda: self.now))
        self.typing = TypingTracker(self.session)
        self.telemetry = TelemetryFeature(self.ls)
        self.telemetry.tracker.clock = lambda: self.now
        self.client = Recorder()
        self.telemetry.client = self.client  # type: ignore[assignment]
        self.version = 1
        self.text = ""
        item = types.TextDocumentItem(uri=URI, language_id="python", version=1, text="")
        self.ls.workspace.put_text_document(item)
        adopt(self.ls.workspace, item)
        self.typing.did_open(URI)
        self.telemetry.did_open(URI)

    def _apply(self, change: types.TextDocumentContentChangeEvent, text: str) -> None:
        self.version += 1
        self.ls.workspace.update_text_document(
            types.VersionedTextDocumentIdentifier(uri=URI, version=self.version), change
        )
        self.text = text
        self.typing.did_change(URI, self.version, [change])
        self.telemetry.did_change(URI, self.version, [change])

    def replace_all(self, text: str) -> None:
        self._apply(types.TextDocumentContentChangeWholeDocument(text=text), text)

    def edit(self, change: TextChange) -> None:
        def position(offset: int) -> types.Position:
            line = self.text.count("\n", 0, offset)
            return types.Position(line, offset - (self.text.rfind("\n", 0, offset) + 1))

        lsp = types.TextDocumentContentChangePartial(
            range=types.Range(position(change.start), position(change.end)), text=change.text
        )
        text = self.text[: change.start] + change.text + self.text[change.end :]
        self._apply(lsp, text)

    def signals(self) -> gate.Signals:
        from lsp_server.features.inline import signals_for

        return signals_for(self.ls, URI, self.typing)


def play_server(
    side: ServerSide, position: Position, previous_end: int, model: Engine
) -> tuple[Decision, UserResponse | None]:
    """What an editor would send for the replay's session at `position`."""
    gap = len(position.prefix) - previous_end
    typed = min(gap, WINDOW_CHARS)
    start = side.now
    # Jump to the text before the last keystrokes (older typing is outside the window), then
    # type them one by one as the replay's typist does.
    cut = len(position.prefix) - typed
    side.replace_all(position.prefix[:cut] + position.suffix)
    for i in range(typed):
        side.now = start + SECONDS_PER_CHAR * (gap - typed + i + 1)
        side.edit(TextChange(cut + i, cut + i, position.prefix[cut + i]))
    side.now = start + SECONDS_PER_CHAR * gap
    request = CompletionRequest(
        prefix=position.prefix,
        suffix=position.suffix,
        language="python",
        path=PATH,
        uri=URI,
        trigger="automatic",
        line=position.line,
        character=position.character,
    )
    decision = model.complete(request, signals=side.signals())
    side.telemetry.on_decision(decision, request)
    if not decision.shown:
        return decision, None
    response = simulated_user(decision.text, position.hole)
    cursor = len(position.prefix)
    now = side.now
    if response.kind == "accepted":
        side.telemetry.on_accept(decision.decision_id, [])
        side.edit(TextChange(cursor, cursor, decision.text))
        if response.retained_chars < len(decision.text):
            end = cursor + len(decision.text)
            side.edit(TextChange(cursor + response.retained_chars, end, ""))
    elif response.kind == "partial":
        side.edit(TextChange(cursor, cursor, decision.text[: response.accepted_chars]))
        side.telemetry.on_dismiss(decision.decision_id)
    else:
        at = cursor
        for ch in position.hole:
            side.edit(TextChange(at, at, ch))
            at += 1
            if side.telemetry.tracker.pending.get(URI) is None:
                break
    side.telemetry.tracker.tick(now + SETTLE_S)
    return decision, response


def comparable(events: list[Any], ids: dict[str, int]) -> list[dict[str, Any]]:
    """Events without what is unique to each (event ids, wall times, timings), decision ids
    numbered in order of appearance."""
    out = []
    for event in events:
        doc = event.model_dump(mode="json", exclude={"event_id", "time", "latency"})
        doc["decision_id"] = ids.setdefault(event.decision_id, len(ids))
        out.append(doc)
    return out


def test_replay_and_server_build_the_same_features_and_events() -> None:
    played = positions()
    model = engine()

    replay = EditingSession(session_id="session", install_id="install", level="metrics")
    replay_vectors, replay_events, replay_kinds = [], [], []
    for position in played:
        signals = replay.arrive(position)
        request = position.request()
        decision = model.complete(request, signals=signals)
        replay.decided(position, request, decision)
        replay_vectors.append(gate.FeatureSpace().row(decision.features))
        if decision.shown:
            response = simulated_user(decision.text, position.hole)
            replay_kinds.append(response.kind)
            replay.respond(position, decision, response)
        replay_events.extend(replay.events)
        replay.events.clear()

    side = ServerSide()
    server_vectors, server_kinds = [], []
    previous_end = 0
    for position in played:
        decision, response = play_server(side, position, previous_end, model)
        previous_end = len(position.prefix)
        server_vectors.append(gate.FeatureSpace().row(decision.features))
        if response is not None:
            server_kinds.append(response.kind)

    # The session is the one described: each kind of reaction happened.
    assert replay_kinds == server_kinds == ["accepted", "partial", "accepted", "ignored"]
    for ours, theirs in zip(replay_vectors, server_vectors, strict=True):
        assert ours.tolist() == pytest.approx(theirs.tolist(), nan_ok=True)
    # The session signals moved: typing speed, accept rate and time since an accept.
    last = played[-1]
    assert replay.signals.signals(replay.uri(last)).recent_accept_rate == pytest.approx(3 / 4)
    assert comparable(replay_events, {}) == comparable(side.client.events, {})
    kinds = [type(e).__name__ for e in replay_events]
    assert kinds.count("DecisionEvent") == 4
    assert kinds.count("OutcomeEvent") == 4
    assert kinds.count("RetentionEvent") == 9  # three checkpoints of three acceptances
    outcomes = [e for e in replay_events if isinstance(e, OutcomeEvent)]
    assert [o.kind for o in outcomes] == ["accepted", "partial", "accepted", "ignored"]
    retained = [e for e in replay_events if isinstance(e, RetentionEvent) and e.after_s == 120]
    assert [(r.accepted_chars, r.retained_chars) for r in retained] == [(14, 14), (4, 4), (14, 14)]
    decisions = [e for e in replay_events if isinstance(e, DecisionEvent)]
    assert all(d.features["typing_speed_cps"] > 0 for d in decisions)
