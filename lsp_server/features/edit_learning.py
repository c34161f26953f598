"""The model learns next edits from the user's own editing: live next-edit examples.

When the user pauses in a document (`completion.next_edit.history.PAUSE_S` without an edit
there), the feature notes what the next-edit predictor would see then: the document's text, the
cursor at the end of the last edit, and a copy of the workspace's edit history (the one
`lsp_server.features.next_edit` keeps). `nextEdit.learnSettleS` seconds later it reads the
document again: the text the user settled on. `training.edit_examples.edit_example` makes the two
an example, the prompt the predictor writes and the window it would rewrite, as it was and as it
became ("no change" is a lesson too), kept in the workspace's `training.edit_store`, from which
the workspace's adapter trains (`training.workspace`: a share of each run) in the same loop as
its completions.

Not kept, and counted in `tabloop/status` (`nextEditLearning`): a change that crosses the
window's edge or has no window (`no_window`), a change with a hunk of more than
`training.edit_replay.MAX_HUNK_LINES` lines (`big_rewrite`), one that undoes the user's previous
edit (`undoes_previous_edit`), a document closed, replaced or edited past a pause before it
settled (`closed`), and a pause while the model is not loaded (`no_model`: its tokenizer sizes the
window). One pause per document is followed at a time; pauses while one settles are `busy`.
Nothing is kept without a workspace root, with `completion.feedbackRows` 0, with next edits off or
with `nextEdit.learnSettleS` 0.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from completion.next_edit import EditHistory
from completion.next_edit.diff import reverts
from completion.next_edit.history import PAUSE_S, EditEvent
from completion.next_edit.text import breaks, lines_of
from lsp_server.config import Settings
from lsp_server.documents import DocumentChange, DocumentListener, open_document
from lsp_server.features.next_edit import NextEditFeature
from lsp_server.server import TabloopServer
from training.edit_examples import EditExample, edit_example
from training.edit_replay import MAX_HUNK_LINES, line_hunks
from training.edit_store import EditExampleStore
from training.feedback import FEEDBACK_FILE
from training.registry import workspace_key

log = logging.getLogger(__name__)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass
class _Pause:
    """What the predictor would have seen at a pause, waiting for the settled text."""

    path: str
    version: int
    text: str
    cursor: tuple[int, int]
    history: EditHistory
    timer: asyncio.TimerHandle | None = None


class EditLearningFeature(DocumentListener):
    """Turns pauses in the user's editing into next-edit training examples."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.store: EditExampleStore | None = None
        self.counts: Counter[str] = Counter()
        self._cursors: dict[str, tuple[tuple[int, int], asyncio.TimerHandle]] = {}
        self._pauses: dict[str, _Pause] = {}

    @property
    def settle_s(self) -> float:
        settings = self.server.settings.next_edit
        return settings.learn_settle_s if settings.enabled else 0.0

    def on_settings(self, settings: Settings) -> None:
        path = settings.cache_path() / FEEDBACK_FILE
        root = self.server.workspace_root
        workspace = workspace_key(root) if root is not None else None
        wanted = (
            settings.completion.feedback_rows > 0
            and settings.next_edit.enabled
            and settings.next_edit.learn_settle_s > 0
            and root is not None
        )
        if self.store is not None and (
            not wanted or self.store.path != path or self.store.workspace != workspace
        ):
            self.store.close()
            self.store = None
            self._forget_all()
        if wanted and self.store is None:
            try:
                self.store = EditExampleStore(path, workspace=root)
            except Exception:
                log.warning("not keeping next-edit examples: cannot open %s", path, exc_info=True)

    # -- documents -------------------------------------------------------------------------

    def did_change(self, change: DocumentChange) -> None:
        if self.store is None or not change.edits:
            return
        pause = self._pauses.get(change.uri)
        if pause is not None and pause.timer is None:
            return  # its settled text is being read
        cursor = _cursor_after(change)
        if cursor is None:  # replaced as a whole: the history forgot the document
            self._forget(change.uri)
            return
        loop = asyncio.get_running_loop()
        earlier = self._cursors.pop(change.uri, None)
        if earlier is not None:
            earlier[1].cancel()
        timer = loop.call_later(PAUSE_S, self._paused, change.uri, change.version)
        self._cursors[change.uri] = (cursor, timer)

    def did_close(self, uri: str) -> None:
        self._forget(uri)

    def _forget(self, uri: str) -> None:
        earlier = self._cursors.pop(uri, None)
        if earlier is not None:
            earlier[1].cancel()
        pause = self._pauses.pop(uri, None)
        if pause is not None:
            if pause.timer is not None:
                pause.timer.cancel()
            self.counts["closed"] += 1

    def _forget_all(self) -> None:
        for uri in list(self._cursors) + list(self._pauses):
            self._forget(uri)

    # -- pauses ----------------------------------------------------------------------------

    def _paused(self, uri: str, version: int) -> None:
        """No edit in `uri` for `PAUSE_S` since version `version`: note what a prediction sees."""
        found = self._cursors.pop(uri, None)
        document = open_document(self.server.workspace, uri)
        if found is None or document is None or (document.version or 0) != version:
            return
        if uri in self._pauses:
            self.counts["busy"] += 1
            return
        edits = self.server.find_feature(NextEditFeature)
        if edits is None:
            return
        pause = _Pause(
            edits.path_of(uri), version, document.source, found[0], edits.history.snapshot()
        )
        pause.timer = asyncio.get_running_loop().call_later(self.settle_s, self._settled, uri)
        self._pauses[uri] = pause

    def _settled(self, uri: str) -> None:
        """The pause's settle time is over: read the text the user settled on."""
        pause = self._pauses.get(uri)
        document = open_document(self.server.workspace, uri)
        engine = self.server.engine
        if pause is None:
            return
        if document is None:
            self._forget(uri)
            return
        if engine is None:
            del self._pauses[uri]
            self.counts["no_model"] += 1
            return
        pause.timer = None
        settled = document.source
        runner = engine.runner
        settings = self.server.settings.next_edit
        loop = asyncio.get_running_loop()

        def make() -> str:
            example = edit_example(
                pause.path,
                pause.text,
                pause.cursor,
                pause.history,
                settled,
                runner.count_tokens,
                settings,
            )
            reason = _refusal(example, pause.history.latest(pause.path))
            if example is not None and reason is None and self.store is not None:
                self.store.record(example)
                return "kept_no_change" if example.no_change else "kept_edit"
            return reason or "no_window"

        def done(future: asyncio.Future[str]) -> None:
            if self._pauses.get(uri) is pause:
                del self._pauses[uri]
            if future.cancelled() or future.exception() is not None:
                log.warning("a next-edit example was not kept: %s", future.exception())
                self.counts["failed"] += 1
            else:
                self.counts[future.result()] += 1

        loop.run_in_executor(None, make).add_done_callback(done)

    def status_parts(self) -> dict[str, Any]:
        """`nextEditLearning` of `tabloop/status`: what became of the pauses."""
        counts = dict(sorted(self.counts.items()))
        learning = {"keeping": self.store is not None, "settling": len(self._pauses), **counts}
        return {"nextEditLearning": learning}

    def on_shutdown(self) -> None:
        self._forget_all()
        if self.store is not None:
            self.store.close()
            self.store = None


def _refusal(example: EditExample | None, previous: EditEvent | None) -> str | None:
    """Why `example` is not one to learn from (None: it is)."""
    if example is None:
        return "no_window"
    if example.no_change:
        return None
    hunks = line_hunks(lines_of(example.current), lines_of(example.target))
    if any(max(len(hunk.old), len(hunk.new)) > MAX_HUNK_LINES for hunk in hunks):
        return "big_rewrite"
    if previous is not None and reverts(example.current, example.target, [previous]):
        return "undoes_previous_edit"
    return None


def _cursor_after(change: DocumentChange) -> tuple[int, int] | None:
    """Where the cursor is after the change's last edit: at the end of the text it inserted
    (code points); None for a whole-text change."""
    last = change.edits[-1]
    if last.whole:
        last = last.narrowed if last.narrowed is not None else last
        if last.whole:
            return None
    count = breaks(last.text)
    if count == 0:
        return last.line, last.character + len(last.text)
    return last.line + count, len(_LINE_BREAK.split(last.text)[-1])


def register(server: TabloopServer) -> None:
    feature = server.add_feature(EditLearningFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.documents.append(feature)  # after next_edit's: the history has the edit
    server.hooks.shutdown.append(feature.on_shutdown)
