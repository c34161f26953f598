"""The server's own next-edit examples, kept per workspace beside its feedback.

At a pause in the user's editing the language server notes what the next-edit predictor would
see (the document, the cursor at the end of the last edit, the workspace's edit history), and
some seconds later the text the user settled on; `training.edit_examples.edit_example` makes the
pair an example (the prompt the predictor writes, the window as it was, the window as it became).
This store keeps those examples in the feedback store's file (`training.feedback.FEEDBACK_FILE`,
a table of its own), under the workspace they were made in, bounded (the oldest go first), never
sent anywhere. The workspace's adapter trains on them beside its code and feedback
(`training.workspace`), so the one adapter the loop trains learns the next-edit task too.
"""

from __future__ import annotations

import sqlite3
import time

from training.edit_examples import EditExample
from training.feedback import WorkspaceTable

DEFAULT_MAX_ROWS = 2_000
"""A workspace's examples kept; the oldest go first (one example is a prompt of about 2 KB)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS edit_examples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    workspace TEXT,
    path TEXT NOT NULL,
    prompt TEXT NOT NULL,
    current TEXT NOT NULL,
    target TEXT NOT NULL
)
"""
_INDEX = "CREATE INDEX IF NOT EXISTS edit_examples_workspace ON edit_examples (workspace, id)"


class EditExampleStore(WorkspaceTable):
    """One workspace's view of the live next-edit examples (safe to use from several threads)."""

    DEFAULT_ROWS = DEFAULT_MAX_ROWS

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute(_SCHEMA)
        db.execute(_INDEX)

    def record(self, example: EditExample) -> None:
        """Keep one example of this workspace; its oldest go beyond `max_rows`."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO edit_examples (created, workspace, path, prompt, current, target)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    self.workspace,
                    example.path,
                    example.prompt,
                    example.current,
                    example.target,
                ),
            )
            self._db.execute(
                "DELETE FROM edit_examples WHERE workspace IS ? AND id <= (SELECT id FROM"
                " edit_examples WHERE workspace IS ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.workspace, self.workspace, self.max_rows),
            )

    def count(self) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM edit_examples WHERE workspace IS ?", (self.workspace,)
            ).fetchone()
        return int(row[0])

    def count_after(self, after_id: int) -> int:
        """This workspace's examples newer than `after_id` (kept since a run started)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM edit_examples WHERE workspace IS ? AND id > ?",
                (self.workspace, after_id),
            ).fetchone()
        return int(row[0])

    def last_id(self) -> int:
        """The newest example's id (0 when none): a run reads the examples up to the id it
        started at, so a resumed run reads the same ones."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(MAX(id), 0) FROM edit_examples WHERE workspace IS ?",
                (self.workspace,),
            ).fetchone()
        return int(row[0])

    def examples(self, upto_id: int, after_id: int = 0) -> list[EditExample]:
        """This workspace's examples after `after_id` up to `upto_id`, newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT path, prompt, current, target FROM edit_examples"
                " WHERE workspace IS ? AND id > ? AND id <= ? ORDER BY id DESC",
                (self.workspace, after_id, upto_id),
            ).fetchall()
        return [EditExample(path, prompt, now, then, "live") for path, prompt, now, then in rows]

    def id_below_newest(self, upto_id: int, newest: int) -> int:
        """The id of the newest example up to `upto_id` once its `newest` examples are left
        out (0 when none is left): a run that holds those out trains on the ids up to it."""
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM edit_examples WHERE workspace IS ? AND id <= ?"
                " ORDER BY id DESC LIMIT 1 OFFSET ?",
                (self.workspace, upto_id, newest),
            ).fetchone()
        return int(row[0]) if row is not None else 0
