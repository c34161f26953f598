"""Next-edit prediction: the edit the user is about to make near the cursor, from recent edits.

The pieces, each usable alone (the language server, `tabloop eval edits` and the trainers share
them):

- `history.EditHistory`: recent edits of a workspace (merged, split at pauses, bounded);
- `prompt`: the window around the cursor under a token budget, and the prompt built on the
  model's own `<|file_sep|>` token (recent edits, then the original / current / updated window);
- `diff`: the smallest edits that turn the current window into the predicted one, and the guards
  that refuse a prediction (outside the window, undoing one of the user's recent edits);
- `predictor.NextEditPredictor`: all of it on a model runner; `predict(...)` answers a
  `NextEditPrediction`, "no change" without a model call when no recent edit is near the cursor;
- `accepted.accepted_state`: the document, cursor and history that accepting a prediction leads
  to, for computing the next prediction ahead.

Nothing here knows about LSP: positions are (line, character) in code points, lines split at
`\\n`, `\\r\\n` and `\\r` as LSP splits them.
"""

from __future__ import annotations

from completion.next_edit.diff import Edit
from completion.next_edit.history import EditEvent, EditHistory
from completion.next_edit.predictor import NextEditPrediction, NextEditPredictor, NextEditTimings
from completion.next_edit.prompt import Window
from completion.next_edit.settings import NextEditSettings

__all__ = [
    "Edit",
    "EditEvent",
    "EditHistory",
    "NextEditPrediction",
    "NextEditPredictor",
    "NextEditSettings",
    "NextEditTimings",
    "Window",
]
