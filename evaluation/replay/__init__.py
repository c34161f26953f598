"""`tabloop eval replay`: the whole learning loop, replayed on real files, measured.

    tabloop eval replay --train DIR --test DIR --rounds R --json

Each round, at sampled positions in the training corpus (as if the rest of the file had not been
typed yet), the real engine produces a suggestion and the serving policy decides; a simulated
user accepts what matches the file, takes right prefixes, and ignores the rest. Decisions,
outcomes and retention go through the real telemetry client to the real backend on loopback,
whose scheduled trainer learns and promotes; the policy client picks the new version up, and the
next round runs on it. At the end the always-show baseline, the built-in policy and the learned
policy are played on the held-out corpus (its events are not sent, so nothing learns from it).

With `--model-loop BUDGET` the model learns too, as it does on a user's machine: the first
round's shown suggestions and their outcomes are kept as the server keeps them
(`training.feedback`), an adapter is trained within the budget on the training corpus's code and
that feedback (`training.workspace.train_workspace`, what `tabloop train model` runs), the runner
serves it, and the held-out corpus is played again with the adapted model, shown always and
through the learned gate (`model_loop` in the report).

Model outputs are cached by prompt hash (`--cache`), so only the first pass runs the model.

The package's modules:

- `player`: `Player` plays positions through the engine and the simulated user; `Tally` sums
  what users saw and kept; `evaluate_policy` and `changes` play and compare policies.
- `rounds`: the loop on loopback (`open_loop`), its rounds, waiting for the trainer.
- `drills`: the canary drill (a wrong-sign candidate the loop must roll back).
- `model_loop`: `--model-loop`, the adapter trained and served.
- `command`: the command line and `run`, from the corpora to the report.

The names other code needs are importable from here (`from evaluation.replay import Player`).
"""

from __future__ import annotations

from evaluation.replay.command import build_parser, main, run
from evaluation.replay.drills import canary_drill, wrong_sign
from evaluation.replay.player import (
    Player,
    Tally,
    always_show,
    changes,
    engine_settings,
    evaluate_policy,
    load_cached_runner,
    reward_of,
)
from evaluation.replay.rounds import EXTRA_ROUNDS, Loop, deliver, open_loop, play_rounds

__all__ = [
    "EXTRA_ROUNDS",
    "Loop",
    "Player",
    "Tally",
    "always_show",
    "build_parser",
    "canary_drill",
    "changes",
    "deliver",
    "engine_settings",
    "evaluate_policy",
    "load_cached_runner",
    "main",
    "open_loop",
    "play_rounds",
    "reward_of",
    "run",
    "wrong_sign",
]
