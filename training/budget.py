"""When a training run ends: a budget of samples, tokens or wall-clock time."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """Seconds in `20m`, `1h30m`, `90s`, `90`; ValueError for anything else."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r} (write 20m, 1h30m or 90s)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"a budget must be positive, not {text!r}")
    return total


@dataclass(frozen=True)
class Budget:
    """When a run ends: the first of samples, tokens (prompt and target) or wall-clock seconds."""

    samples: int | None = None
    tokens: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.samples is None and self.tokens is None and self.seconds is None:
            raise ValueError("a budget needs samples, tokens or a duration")

    def reached(self, samples: int, tokens: int, seconds: float) -> bool:
        return (
            (self.samples is not None and samples >= self.samples)
            or (self.tokens is not None and tokens >= self.tokens)
            or (self.seconds is not None and seconds >= self.seconds)
        )

    def fraction(self, samples: int, tokens: int, seconds: float) -> float:
        parts = [
            done / limit
            for done, limit in (
                (samples, self.samples),
                (tokens, self.tokens),
                (seconds, self.seconds),
            )
            if limit
        ]
        return min(1.0, max(parts))
