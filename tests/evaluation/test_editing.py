"""One definition of the session: a scripted session played by the replay and told to the server.

The replay's `EditingSession` and the language server's own objects (the session feature with its
`TypingTracker` and outcome tracker, the telemetry feature with `decision_event`) are given
the same session: the same keystrokes at the same (simulated) times, the same suggestions, the
same user reactions. The gate must see identical feature vectors, and the backend must receive
identical events, from both, in every language: the server names it by the editor's id (or, when
the editor gives none, by the file's extension), the replay by the file's extension.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from completion import gate
from completion.engine import Engine
from completion.settings import CompletionSettings
from completion.types import Decision
from evaluation.editing import SECONDS_PER_CHAR, SETTLE_S, EditingSession
from evaluation.simulation import Position, UserResponse, simulated_user
from lsp_server.documents import adopt, open_document
from lsp_server.features.inline import build_request
from lsp_server.features.session import SessionFeature
from lsp_server.features.telemetry import TelemetryFeature
from lsp_server.outcomes import TextChange
from lsp_server.server import TabloopServer
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent
from tests.support.languages import ONCE_SKEWED
from tests.support.scripted_model import ScriptedModel

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


# A file of each kind, with the id an editor sends for it (VS Code's; Neovim's filetype where it
# differs; none: the server falls back to the extension). The scripted model answers the same
# whatever the language.
FILES = [
    *(
        pytest.param(f"/work/example.{ext}", lsp_id, lsp_id, id=ext)
        for ext, lsp_id in ONCE_SKEWED.items()
    ),
    pytest.param("/work/example.cs", "cs", "csharp", id="cs-neovim-filetype"),
    pytest.param("/work/example.rb", "", "ruby", id="rb-no-editor-id"),
]


def positions(path: str) -> list[Position]:
    found = []
    for marker, _ in CURSORS:
        offset = TEXT.index(marker) + len(marker)
        line = TEXT.count("\n", 0, offset)
        column = offset - (TEXT.rfind("\n", 0, offset) + 1)
        found.append(Position(path, TEXT[:offset], TEXT[offset:], line, column))
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

    def __init__(self, path: str, editor_id: str) -> None:
        self.uri = Path(path).as_uri()
        self.now = 0.0
        self.ls = TabloopServer()
        next(
            self.ls.protocol.lsp_initialize(
                types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=None)
            ),
            None,
        )
        self.outcomes = SessionFeature(self.ls, clock=lambda: self.now)
        self.typing = self.outcomes.typing
        self.telemetry = TelemetryFeature(self.ls)
        self.client = Recorder()
        self.telemetry.client = self.client  # type: ignore[assignment]
        # What `register` wires: the session feature's outcomes go to telemetry.
        self.ls.hooks.outcome.append(self.telemetry.record)
        self.ls.hooks.retention.append(self.telemetry.record)
        self.version = 1
        self.text = ""
        item = types.TextDocumentItem(uri=self.uri, language_id=editor_id, version=1, text="")
        self.ls.workspace.put_text_document(item)
        adopt(self.ls.workspace, item)
        self.outcomes.did_open(self.uri)

    def _apply(self, change: types.TextDocumentContentChangeEvent, text: str) -> None:
        self.version += 1
        self.ls.workspace.update_text_document(
            types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version), change
        )
        self.text = text
        document = open_document(self.ls.workspace, self.uri)
        assert document is not None
        self.outcomes.did_change(document.take_change())  # what every listener is handed

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

        return signals_for(self.ls, self.uri, self.typing)


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
    # The request as the inline feature builds it from the document the editor keeps.
    document = open_document(side.ls.workspace, side.uri)
    assert document is not None
    cursor_at = types.Position(position.line, position.character)
    request = build_request(document, cursor_at, "automatic")
    decision = model.complete(request, signals=side.signals())
    side.telemetry.on_decision(decision, request)
    side.outcomes.on_decision(decision, request)
    if not decision.shown:
        return decision, None
    response = simulated_user(decision.text, position.hole)
    cursor = len(position.prefix)
    now = side.now
    if response.kind == "accepted":
        side.outcomes.on_accept(decision.decision_id, [])
        side.edit(TextChange(cursor, cursor, decision.text))
        if response.retained_chars < len(decision.text):
            end = cursor + len(decision.text)
            side.edit(TextChange(cursor + response.retained_chars, end, ""))
    elif response.kind == "partial":
        side.edit(TextChange(cursor, cursor, decision.text[: response.accepted_chars]))
        side.outcomes.on_dismiss(decision.decision_id)
    else:
        at = cursor
        for ch in position.hole:
            side.edit(TextChange(at, at, ch))
            at += 1
            if side.outcomes.tracker.pending.get(side.uri) is None:
                break
    side.outcomes.tracker.tick(now + SETTLE_S)
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


@pytest.mark.parametrize(("path", "editor_id", "lsp_id"), FILES)
def test_replay_and_server_build_the_same_features_and_events(
    path: str, editor_id: str, lsp_id: str
) -> None:
    played = positions(path)
    model = engine()

    replay = EditingSession(session_id="session", install_id="install", level="metrics")
    replay_vectors, replay_events, replay_kinds, languages = [], [], [], []
    for position in played:
        signals = replay.arrive(position)
        request = position.request()
        decision = model.complete(request, signals=signals)
        replay.decided(position, request, decision)
        replay_vectors.append(gate.FeatureSpace().row(decision.features))
        languages.append(decision.features["language"])
        if decision.shown:
            response = simulated_user(decision.text, position.hole)
            replay_kinds.append(response.kind)
            replay.respond(position, decision, response)
        replay_events.extend(replay.events)
        replay.events.clear()

    side = ServerSide(path, editor_id)
    server_vectors, server_kinds = [], []
    previous_end = 0
    for position in played:
        decision, response = play_server(side, position, previous_end, model)
        previous_end = len(position.prefix)
        server_vectors.append(gate.FeatureSpace().row(decision.features))
        languages.append(decision.features["language"])
        if response is not None:
            server_kinds.append(response.kind)

    # The session is the one described: each kind of reaction happened.
    assert replay_kinds == server_kinds == ["accepted", "partial", "accepted", "ignored"]
    # Both sides name the language by the LSP id the gate has a column for.
    assert set(languages) == {lsp_id}
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
