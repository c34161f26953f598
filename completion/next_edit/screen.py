"""The screen: whether an edit inside the window is likely enough to ask the model at all.

Rewriting the window costs the model a read of the whole prompt (recent edits, the window before
and now) and a check of the window as its draft: seconds on a 2-core CPU. Most of the time
the answer is "no change" (no edit follows in the window at about two points in three of real
histories). The screen reads what the prediction sees (the window, the latest edit in this
document, the recent events) as a few numbers and a logistic model gives the probability that
the next edit falls inside the window; below `nextEdit.screenBelow` the answer is "no change"
without the model (the whole answer took 1.2–1.6 ms at p50 in `tabloop eval edits`).

The signals (each measured on replayed histories, `tabloop train edit-screen`): names the
latest edit removed that are still in the window (a rename not carried through), lines of the
window like those the edit changed (a repeated pattern), the edit's size, how many recent events
this document has (a run of edits), and where the cursor and the document's end sit in the
window. The bundled screen (`screen.json` here) is what `tabloop train edit-screen` wrote for
the histories named inside it; a screen of one's own (`nextEdit.screenWeights`, a file that
command writes) is read instead when given.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.next_edit.history import EditEvent
from completion.next_edit.prompt import Window
from completion.next_edit.text import common_ends

SCREEN_FORMAT = "tabloop.edit-screen/1"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SIMILAR = 0.8
"""How alike (difflib's ratio) a window line must be to a line the edit removed to count as the
same pattern."""

FEATURES = (
    "removed_names_in_window",
    "removed_names",
    "inserted_names_in_window",
    "removed_lines",
    "inserted_lines",
    "removed_chars",
    "inserted_chars",
    "pure_insertion",
    "pure_deletion",
    "similar_lines",
    "lines_below",
    "lines_above",
    "window_lines",
    "end_in_window",
    "events_here",
)
"""The screen's inputs, in the weights' order; counts enter as log(1 + count)."""


class ScreenError(ValueError):
    """A screen file that cannot be read (with the reason)."""


def screen_features(
    lines: Sequence[str],
    window: Window,
    cursor_line: int,
    latest: EditEvent,
    events: Sequence[EditEvent],
) -> dict[str, float]:
    """The screen's inputs for `window` of a document (`lines`), the cursor's line, the latest
    edit in this document and the workspace's recent events. Reads only the window and the
    event's blocks."""
    head, tail = common_ends(latest.original, latest.updated)  # the event's context
    removed = latest.original[head : len(latest.original) - tail]
    inserted = latest.updated[head : len(latest.updated) - tail]
    removed_text, inserted_text = "".join(removed), "".join(inserted)
    removed_names = set(IDENTIFIER.findall(removed_text))
    inserted_names = set(IDENTIFIER.findall(inserted_text))
    gone, new = removed_names - inserted_names, inserted_names - removed_names
    region = range(latest.start + head, latest.end - tail)  # the lines the edits wrote
    outside = [
        line for number, line in enumerate(window.lines, window.start) if number not in region
    ]
    outside_names = set(IDENTIFIER.findall("".join(outside)))
    patterns = [line.strip() for line in removed if len(line.strip()) >= 4]
    similar = 0
    for line in outside:
        text = line.strip()
        if len(text) < 4:
            continue
        for pattern in patterns:
            matcher = difflib.SequenceMatcher(None, pattern, text, autojunk=False)
            if matcher.quick_ratio() > SIMILAR and matcher.ratio() > SIMILAR:
                similar += 1
                break
    counts = {
        "removed_names_in_window": len(gone & outside_names),
        "removed_names": len(gone),
        "inserted_names_in_window": len(new & outside_names),
        "removed_lines": len(removed),
        "inserted_lines": len(inserted),
        "removed_chars": len(removed_text),
        "inserted_chars": len(inserted_text),
        "similar_lines": similar,
        "lines_below": max(0, window.end - cursor_line - 1),
        "lines_above": max(0, cursor_line - window.start),
        "window_lines": len(window.lines),
        "events_here": sum(1 for event in events if event.path == latest.path),
    }
    found = {name: math.log1p(value) for name, value in counts.items()}
    found["pure_insertion"] = float(not removed and bool(inserted))
    found["pure_deletion"] = float(bool(removed) and not inserted)
    # LSP counts an empty last line after a final break: the window may stop just before it.
    found["end_in_window"] = float(window.end >= len(lines) - (not lines[-1]))
    return {name: found[name] for name in FEATURES}


@dataclass(frozen=True)
class EditScreen:
    """A logistic model of P(the next edit lies inside the window) over `FEATURES`, on inputs
    standardised by `mean` and `scale`; `trained_on` says from what."""

    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    trained_on: Mapping[str, Any]

    def __post_init__(self) -> None:
        sizes = {len(self.weights), len(self.mean), len(self.scale)}
        if sizes != {len(FEATURES)}:
            raise ScreenError(f"a screen needs {len(FEATURES)} weights, means and scales")
        if any(s <= 0 for s in self.scale) or not all(
            math.isfinite(v) for v in (*self.weights, *self.mean, *self.scale, self.bias)
        ):
            raise ScreenError("a screen's numbers must be finite, its scales positive")

    def probability(self, features: Mapping[str, float]) -> float:
        """P(an edit follows inside the window) for `screen_features`' output."""
        logit = self.bias + sum(
            w * (features[name] - m) / s
            for name, w, m, s in zip(FEATURES, self.weights, self.mean, self.scale, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, logit))))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SCREEN_FORMAT,
            "features": list(FEATURES),
            "weights": list(self.weights),
            "bias": self.bias,
            "mean": list(self.mean),
            "scale": list(self.scale),
            "trained_on": dict(self.trained_on),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EditScreen:
        if data.get("format") != SCREEN_FORMAT:
            raise ScreenError(f"not a {SCREEN_FORMAT} document")
        if list(data.get("features", ())) != list(FEATURES):
            raise ScreenError(f"the screen's features are not this version's: {FEATURES}")
        try:
            return cls(
                tuple(float(v) for v in data["weights"]),
                float(data["bias"]),
                tuple(float(v) for v in data["mean"]),
                tuple(float(v) for v in data["scale"]),
                dict(data.get("trained_on", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScreenError(f"a screen's numbers are missing or wrong: {exc}") from None

    @classmethod
    def read(cls, path: Path) -> EditScreen:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScreenError(f"cannot read the screen {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ScreenError(f"{path} is not a screen")
        return cls.from_json(data.get("screen", data))


BUNDLED = Path(__file__).with_name("screen.json")
"""The screen `tabloop train edit-screen` fitted on public histories (named inside)."""

_read: dict[Path, EditScreen] = {}


def load_screen(weights: str = "") -> EditScreen:
    """The screen in the file `weights` (`nextEdit.screenWeights`), else the bundled one; each
    file is read once. Raises `ScreenError` for a file that is not a screen."""
    path = Path(weights).expanduser() if weights else BUNDLED
    found = _read.get(path)
    if found is None:
        found = _read[path] = EditScreen.read(path)
    return found
