"""What the gate's features say about acceptance, and whether a pre-model gate could pay.

At sampled positions in a corpus (as `tabloop eval replay` samples them), every suggestion is
shown to the replay's simulated user. For each numeric feature the report gives its AUC for
"accepted whole or in part" (0.5: no signal; below 0.5: the signal is inverted). Then two
logistic models are cross-validated (5 folds): one on every feature, as the gate sees them
after the model ran, and one on the features known before the model runs (cursor, block,
user), which is all a pre-model gate could use. For the pre-model one the report lists, per share
of model calls it would skip, the share of accepted characters that would be lost with them.

The baseline is measured in the same run, on the same suggestions: a gate that skips calls at
random (a seeded uniform score), with its AUC and the accepted characters it loses at the same
skip shares. A pre-model gate pays only where it loses clearly fewer than that.

`reward_defaults` shows, for each distraction cost λ (characters), what a gate that learned the
reward (retained characters, -λ when ignored) would trade against always-show on these
suggestions: a ridge model of the reward is cross-validated, and a suggestion is shown when its
out-of-fold prediction is positive. The trainer's default λ is chosen from this on the training
corpus only. The built-in policy's figures on the same suggestions stand beside it.

`ceiling` is what the learning loop could reach at best with these features: a gate that knows
every outcome (the cross-validated acceptance model above, each suggestion scored by a model that
did not see it) silences the lowest-scored 20-35% of the suggestions; per share, the trade
against always-show, the reward change at the trainer's default λ, and whether the loop's goals
(shown <= -21%, accept rate >= +28%, accepted characters >= -5%, a reward gain) hold there. A
learner that sees outcomes only of what it showed does no better than this.

With `--held-out DIR`, the acceptance model fitted on every outcome of `--corpus` scores the
suggestions at `--held-out-positions` positions of another corpus (`held_out`): its AUC there, and
the same ceiling, which is what a gate learned on one codebase could do at best on another.

    tabloop bench gate --corpus DIR [--positions 400] [--held-out DIR] [--cache FILE] [--json]

Model outputs come from (and go to) the replay's output cache, so a corpus the replay already
played costs no model time.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from completion.gate import Features, FeatureSpace
    from completion.output_cache import CachedRunner

# Known before the model runs: where the cursor is, and what the server knows about the user.
PRE_MODEL_FEATURES = (
    "code_after_cursor",
    "closers_after_cursor",
    "cursor_column",
    "indent_depth",
    "at_line_start",
    "mid_word",
    "after_dot",
    "after_block_opener",
    "file_position",
    "invoked",
    "seconds_since_last_accept",
    "recent_accept_rate",
)
FOLDS = 5
SKIP_SHARES = (0.1, 0.2, 0.3)
LAMBDAS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
CEILING_SHARES = (0.2, 0.25, 0.3, 0.35)
# The learning loop's goals against always-show (docs/learning.md).
GOALS = {
    "shown_change_pct": -21.0,
    "accept_rate_change_pct": 28.0,
    "accepted_chars_change_pct": -5.0,
}


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (ties count half), by the rank-sum formula."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    for value in np.unique(score):  # average ranks over ties
        tied = score == value
        ranks[tied] = ranks[tied].mean()
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        return float("nan")  # one class only: undefined
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-2) -> np.ndarray:
    """Weights (bias last) of an L2-regularised logistic regression on standardised `x`."""
    import torch

    xt = torch.as_tensor(np.hstack([x, np.ones((len(x), 1))]), dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.float64)
    w = torch.zeros(xt.shape[1], dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([w], max_iter=200)

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w, yt)
        loss = loss + l2 * torch.sum(w[:-1] ** 2)
        loss.backward()
        return loss

    optimiser.step(closure)
    return w.detach().numpy()


def fitted_scores(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Logits for `x_test` of a logistic model fitted on `x_train`, standardised on it."""
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-9
    w = fit_logistic((x_train - mean) / std, y_train)
    return np.hstack([(x_test - mean) / std, np.ones((len(x_test), 1))]) @ w


def cross_validated_scores(x: np.ndarray, y: np.ndarray, seed: int = 0) -> np.ndarray:
    """Out-of-fold logits of a logistic model, standardised on each training fold."""
    order = np.random.default_rng(seed).permutation(len(y))
    scores = np.zeros(len(y))
    for fold in range(FOLDS):
        test = order[fold::FOLDS]
        train = np.setdiff1d(order, test)
        scores[test] = fitted_scores(x[train], y[train], x[test])
    return scores


def cross_validated_ridge(
    x: np.ndarray, target: np.ndarray, ridge: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Out-of-fold predictions of a ridge regression (intercept not shrunk), as the trainer's
    reward model fits it."""
    order = np.random.default_rng(seed).permutation(len(target))
    predictions = np.zeros(len(target))
    for fold in range(FOLDS):
        test = order[fold::FOLDS]
        train = np.setdiff1d(order, test)
        mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-9
        design = np.hstack([(x[train] - mean) / std, np.ones((len(train), 1))])
        penalty = ridge * np.eye(design.shape[1])
        penalty[-1, -1] = 0.0
        coef = np.linalg.solve(design.T @ design + penalty, design.T @ target[train])
        predictions[test] = np.hstack([(x[test] - mean) / std, np.ones((len(test), 1))]) @ coef
    return predictions


def trade(shown: np.ndarray, accepted: np.ndarray, chars: np.ndarray) -> dict[str, float | None]:
    """What showing only `shown` changes against showing everything (percent)."""

    def pct(new: float, old: float) -> float | None:
        return round(100.0 * (new - old) / old, 2) if old else None

    base_rate = accepted.mean() if len(accepted) else 0.0
    rate = accepted[shown].mean() if shown.any() else 0.0
    return {
        "shown_change_pct": pct(float(shown.sum()), float(len(shown))),
        "accept_rate_change_pct": pct(float(rate), float(base_rate)),
        "accepted_chars_change_pct": pct(float(chars[shown].sum()), float(chars.sum())),
    }


def reward_defaults(
    x: np.ndarray,
    accepted: np.ndarray,
    accepted_chars: np.ndarray,
    retained_chars: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """Per λ, the trade a gate that learned the reward would make (see the module's doc)."""
    out: dict[str, Any] = {}
    for lam in LAMBDAS:
        reward = np.where(accepted, retained_chars, -lam)
        shown = cross_validated_ridge(x, reward, seed=seed) > 0
        gained = float(np.where(shown, reward, 0.0).sum() - reward.sum())
        out[f"{lam:g}"] = {
            **trade(shown, accepted, accepted_chars),
            "reward_change_per_suggestion": round(gained / len(reward), 3) if len(reward) else None,
        }
    return out


def goals_met(figures: dict[str, float | None]) -> bool:
    """Whether a trade against always-show meets the loop's goals (`GOALS`)."""
    for name, goal in GOALS.items():
        value = figures.get(name)
        if value is None:
            return False
        if value > goal if name == "shown_change_pct" else value < goal:
            return False
    return True


def ceiling(
    score: np.ndarray,
    accepted: np.ndarray,
    accepted_chars: np.ndarray,
    retained_chars: np.ndarray,
    lam: float,
) -> dict[str, Any]:
    """Per share of suggestions silenced (the lowest `score`), the trade against always-show,
    the reward change at distraction cost `lam`, and whether the loop's goals hold."""
    reward = np.where(accepted, retained_chars, -lam)
    order = np.argsort(score, kind="mergesort")
    out: dict[str, Any] = {}
    for share in CEILING_SHARES:
        shown = np.ones(len(score), dtype=bool)
        shown[order[: round(share * len(order))]] = False
        figures = trade(shown, accepted, accepted_chars)
        gain = float(reward[shown].sum() - reward.sum())
        out[f"silence_{share:.0%}"] = {
            **figures,
            "reward_change": round(gain, 1),
            "goals_met": goals_met(figures) and gain > 0,
        }
    return out


def lost_chars_when_skipping(score: np.ndarray, chars: np.ndarray) -> dict[str, float | None]:
    """Share of accepted characters lost when the lowest-scored share of calls is skipped."""
    order = np.argsort(score, kind="mergesort")
    total = chars.sum()
    lost: dict[str, float | None] = {}
    for share in SKIP_SHARES:
        skipped = order[: round(share * len(order))]
        lost[f"skip_{share:.0%}"] = round(float(chars[skipped].sum() / total), 4) if total else None
    return lost


def _rounded(value: float) -> float | None:
    """JSON has no NaN: an undefined AUC (every suggestion accepted, or none) is null."""
    return None if np.isnan(value) else round(value, 3)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench gate", description=__doc__)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--positions", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--engine", choices=("auto", "ctranslate2", "torch"), default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=10)
    parser.add_argument("--context-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=None, help="model output cache file")
    parser.add_argument(
        "--held-out",
        type=Path,
        default=None,
        help="another corpus: the acceptance model fitted on --corpus is judged on it",
    )
    parser.add_argument("--held-out-positions", type=int, default=400)
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    args = parser.parse_args(argv)
    report = {"command": "tabloop bench gate " + " ".join(argv), **measure(args)}
    print(json.dumps(report, indent=2, allow_nan=False))
    return 0


@dataclass
class Played:
    """Every non-empty suggestion at a corpus's sampled positions, shown to the simulated user."""

    positions: int
    features: list[Features]
    accepted: np.ndarray  # whole or in part
    accepted_chars: np.ndarray
    retained_chars: np.ndarray


def play(args: argparse.Namespace, runner: CachedRunner, corpus: Path, count: int) -> Played:
    """Play `count` sampled positions of `corpus` with always-show."""
    from backend.policy.settings import RewardSettings
    from completion.engine import Engine
    from evaluation.replay import Player, always_show, engine_settings
    from evaluation.simulation import sample_positions

    policy = always_show()
    engine = Engine(engine_settings(args), runner, policy_source=lambda: policy, seed=args.seed)
    positions = sample_positions(corpus, count, args.seed)
    player = Player(engine, None, RewardSettings(distraction_cost=0.0), min_partial_chars=4)
    player.log = []
    player.play(positions)
    shown = [(d, r) for d, r in player.log if d.text and r is not None]
    played = Played(
        positions=len(positions),
        features=[d.features for d, _ in shown],
        accepted=np.array([r.kind != "ignored" for _, r in shown], dtype=bool),
        accepted_chars=np.array([r.accepted_chars for _, r in shown], dtype=np.float64),
        retained_chars=np.array([r.retained_chars for _, r in shown], dtype=np.float64),
    )
    return played


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The report; the model is loaded once, for both corpora."""
    from evaluation.replay import engine_settings, load_cached_runner

    settings = engine_settings(args)
    runner = load_cached_runner(args, settings.model_copy(update={"cache": True}))
    try:
        played = play(args, runner, args.corpus, args.positions)
        other = (
            play(args, runner, args.held_out, args.held_out_positions) if args.held_out else None
        )
    finally:
        runner.close()
    return _report(args, played, other, runner.model_id)


def _report(
    args: argparse.Namespace, played: Played, other: Played | None, model_id: str
) -> dict[str, Any]:
    from backend.policy.settings import RewardSettings
    from completion.gate import FeatureSpace, builtin_policy

    lam = RewardSettings().distraction_cost
    features = played.features
    retained = played.retained_chars
    builtin_shows = builtin_policy().intent_batch(features) > 0.5 if features else np.zeros(0, bool)

    space = FeatureSpace()
    x = np.nan_to_num(space.matrix(features))
    y = played.accepted
    accepted_chars = played.accepted_chars
    names = [spec.name for spec in space.numeric]
    per_feature = {
        name: _rounded(auc(x[:, j], y))
        for j, name in enumerate(names)
        if np.ptp(x[:, j]) > 0  # constant here: says nothing
    }
    columns = [j for j, name in enumerate(names) if name in PRE_MODEL_FEATURES]
    after_model = cross_validated_scores(x, y.astype(np.float64), args.seed)
    pre_model = cross_validated_scores(x[:, columns], y.astype(np.float64), args.seed)
    random_skip = np.random.default_rng(args.seed).random(len(y))
    report = {
        "corpus": str(args.corpus),
        "positions": played.positions,
        "suggestions": len(y),
        "accept_rate": round(float(y.mean()), 4) if len(y) else None,
        "model": model_id,
        "feature_auc": dict(sorted(per_feature.items(), key=lambda kv: -abs((kv[1] or 0.5) - 0.5))),
        "gate_cv_auc": _rounded(auc(after_model, y)),
        "pre_model_cv_auc": _rounded(auc(pre_model, y)),
        "pre_model_accepted_chars_lost": lost_chars_when_skipping(pre_model, accepted_chars),
        "reward_defaults": reward_defaults(x, y, accepted_chars, retained, args.seed),
        "ceiling": {"lambda": lam, **ceiling(after_model, y, accepted_chars, retained, lam)},
        "builtin_policy": trade(builtin_shows, y, accepted_chars) if len(y) else None,
        "baseline": {
            "gate": "random skip (seeded), same suggestions",
            "auc": _rounded(auc(random_skip, y)),
            "accepted_chars_lost": lost_chars_when_skipping(random_skip, accepted_chars),
        },
    }
    if other is not None:
        report["held_out"] = held_out_ceiling(args.held_out, other, x, y, space, lam)
    return report


def held_out_ceiling(
    corpus: Path, other: Played, x: np.ndarray, y: np.ndarray, space: FeatureSpace, lam: float
) -> dict[str, Any]:
    """The acceptance model fitted on every outcome of `--corpus` (`x`, `y`), judged on the
    suggestions of `--held-out`: what a gate learned on one codebase could do at best on another;
    the built-in policy beside it."""
    from completion.gate import builtin_policy

    x_other = np.nan_to_num(space.matrix(other.features))
    score = fitted_scores(x, y.astype(np.float64), x_other)
    y_other = other.accepted
    builtin = builtin_policy().intent_batch(other.features) > 0.5 if other.features else None
    return {
        "corpus": str(corpus),
        "positions": other.positions,
        "suggestions": len(y_other),
        "accept_rate": round(float(y_other.mean()), 4) if len(y_other) else None,
        "gate_auc": _rounded(auc(score, y_other)),
        "ceiling": {
            "lambda": lam,
            **ceiling(score, y_other, other.accepted_chars, other.retained_chars, lam),
        },
        "builtin_policy": (
            trade(builtin, y_other, other.accepted_chars) if builtin is not None else None
        ),
    }
