"""Which logged outcomes a new adapter version trains on, and which judge it: the training window.

One rule for a workspace's local feedback (`training.feedback`) and a backend tenant's events
(`backend.adapters.dataset`). Every outcome has a key, (time, row): the time it was logged and
its row in the store, which breaks ties. The serving version records the key of the newest
outcome it trained on, its *mark*. A new version:

- trains on the outcomes *after* the mark, newest first, so a budget that ends early has spent
  itself on the newest ones;
- less the newest `held_out_share` of them, held out to judge it and never trained on (they are
  after the next mark too, so the version after trains on them);
- plus, so that it does not forget, older outcomes (at or before the mark) replayed among them:
  `replay_share` of what an epoch trains on, drawn anew each epoch from the seed (the same in
  every run with the same seed, which a resumed run needs).

With no mark (nothing serves yet, or the serving version was trained before marks were kept)
every outcome is new and nothing is replayed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from training.examples import seeded_random
from training.trainer import mixed_stream

OutcomeKey = tuple[float, int]
"""(time in seconds since the epoch, row): the order of logged outcomes."""
DEFAULT_REPLAY_SHARE = 0.25
DEFAULT_HELD_OUT_SHARE = 0.2


@dataclass(frozen=True)
class WindowSettings:
    """How much of older history a version replays, and how much of the newest it holds out."""

    replay_share: float = DEFAULT_REPLAY_SHARE
    held_out_share: float = DEFAULT_HELD_OUT_SHARE

    def __post_init__(self) -> None:
        for name in ("replay_share", "held_out_share"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), not {getattr(self, name)}")


@dataclass(frozen=True)
class TrainingWindow:
    """The outcomes of one run, each list newest first."""

    mark: OutcomeKey | None  # what the serving version was trained up to (None: nothing)
    new: tuple[OutcomeKey, ...]  # after the mark, not held out: trained on, all of them
    older: tuple[OutcomeKey, ...]  # at or before the mark: the replay pool
    held_out: tuple[OutcomeKey, ...]  # the newest after the mark: judge the version only
    replay_share: float = DEFAULT_REPLAY_SHARE

    @property
    def replayed(self) -> int:
        """Older outcomes replayed per epoch: `replay_share` of the epoch, as far as the pool
        allows (none when nothing is new: a version is not trained on replays alone)."""
        if not self.new or not self.older or self.replay_share <= 0:
            return 0
        wanted = round(len(self.new) * self.replay_share / (1.0 - self.replay_share))
        return min(len(self.older), max(wanted, 1))

    @property
    def trainable(self) -> tuple[OutcomeKey, ...]:
        """Every outcome an epoch may draw from (not held out)."""
        return self.new + self.older

    @property
    def trained_through(self) -> OutcomeKey | None:
        """The mark of a version trained on this window: its newest new outcome (the mark it
        started from when nothing was new)."""
        return self.new[0] if self.new else self.mark

    def is_held_out(self, key: OutcomeKey) -> bool:
        return bool(self.held_out) and key >= self.held_out[-1]

    def epoch(self, seed: int, number: int) -> list[OutcomeKey]:
        """The order of epoch `number`: the new outcomes newest first, with this epoch's replayed
        ones (newest first) interleaved at `replay_share`."""
        draw = seeded_random(seed, "replay", number, self.mark)
        replayed = sorted(draw.sample(self.older, self.replayed), reverse=True)
        return list(mixed_stream(iter(self.new), iter(replayed), self.replay_share))

    def summary(self) -> dict[str, Any]:
        """What the run's report and the version's record say of the window."""
        return {
            "new": len(self.new),
            "replayed": self.replayed,
            "held_out": len(self.held_out),
            "older": len(self.older),
            "replay_share": self.replay_share,
            "since": list(self.mark) if self.mark is not None else None,
            "trained_through": (
                list(self.trained_through) if self.trained_through is not None else None
            ),
        }


def select_window(
    keys: Iterable[OutcomeKey], mark: OutcomeKey | None, settings: WindowSettings
) -> TrainingWindow:
    """The window over the outcomes `keys` for a version that starts from `mark`."""
    ordered = sorted(set(keys), reverse=True)
    after = [k for k in ordered if mark is None or k > mark]
    older = [k for k in ordered if mark is not None and k <= mark]
    held = int(len(after) * settings.held_out_share)
    return TrainingWindow(
        mark, tuple(after[held:]), tuple(older), tuple(after[:held]), settings.replay_share
    )


def mark_of(train: dict[str, Any] | None) -> OutcomeKey | None:
    """The mark a version's training record holds (None: none recorded)."""
    window = (train or {}).get("window")
    value = window.get("trained_through") if isinstance(window, dict) else None
    if value is None:
        return None
    time, row = value
    return (float(time), int(row))


def window_problem(train: dict[str, Any]) -> str | None:
    """What is wrong with a training record's window (for the registry's check), or None."""
    window = train.get("window")
    if window is None:
        return None
    if not isinstance(window, dict):
        return "a version's window is not an object"
    for name in ("since", "trained_through"):
        value = window.get(name)
        if value is None:
            continue
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or not float(value[1]).is_integer()
        ):
            return f"a version's window {name} is not a (time, row) pair"
    return None
