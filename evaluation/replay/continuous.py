"""`--continuous`: the whole loop over time, as the language server runs it by itself.

    tabloop eval replay --continuous --train DIR --rounds 3 --round-positions 100 --json

The code base is revealed part by part: its files, in an order drawn from the seed, are cut into
`--rounds` parts, and round k copies part k into a workspace the rounds share (later rounds reach
files the earlier ones never saw). In a round the simulated user types at positions in the newly
revealed files only, so every round is judged on code no model version has trained on, in
`--sessions-per-round` sessions; each session serves the adapter version the workspace's registry
gives it (`AdapterRegistry.serving_for`, the canary's arm included) and the gate's serving policy.
Decisions and outcomes go to the gate's loop on loopback (`rounds.open_loop`) and the shown
suggestions with their outcomes to the workspace's feedback store, exactly as the server keeps
them (tagged with the version that wrote them). The same positions are then played with the base
model shown always (the goal's baseline, nothing reported).

After each round but the last, the replay does what the server's training loop does
(`lsp_server.features.training_loop`): it settles the adapter canary on the feedback
(`settle_local_canary`), asks `wait_reason` whether a run is due under the training settings, and
if so runs the very command the server starts (`train_command`, `child_environment`, the lowest
priority) and waits for it; a promoted version serves the next round. The training settings are
`TrainingLoopSettings()` unless `--loop-setting KEY=VALUE` changes one (the report lists every
change).

The replay's clock is the real clock plus the waits the server would make and the replay does not
sleep through: `idle_s` after the round's last request (the editor must be idle), a whole
`check_every_s` (the worst case of the periodic look), and what is left of `min_interval_s` since
the last run started (the user is taken to go on typing meanwhile). `event_to_serving_s` is the
time from the round's last event to the new version serving: those waits, the run (training and
judging, real), and the swap of the runner to the new version (merging and converting it, real).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.policy.dataset import latest_event_id
from common.config import configured_cache_dir
from completion.engine import Engine
from completion.gate import CanaryPolicy
from completion.output_cache import CachedRunner
from completion.settings import CompletionSettings
from evaluation.holes import setting_overrides
from evaluation.replay.player import (
    Player,
    Tally,
    always_show,
    changes,
    evaluate_policy,
    public,
    reward_of,
)
from evaluation.replay.rounds import Loop, await_training, deliver
from evaluation.simulation import Position, sample_positions
from training.background import (
    INTERRUPTED,
    OVER_MEMORY,
    Activity,
    LoopRecord,
    Material,
    TrainingChild,
    child_environment,
    outcome_of_report,
    train_command,
    wait_reason,
)
from training.examples import workspace_files
from training.feedback import FEEDBACK_FILE, FeedbackStore
from training.local_canary import settle_local_canary, workspace_label
from training.registry import (
    AdapterRegistry,
    AdapterRegistryError,
    parse_version_label,
    scope_dir,
    version_label,
)
from training.settings import TrainingLoopSettings
from training.window import mark_of

log = logging.getLogger(__name__)

POLL_S = 1.0

Play = tuple[dict[str, Any], dict[str, Any]]
"""A round's two plays in `evaluate_policy`'s form: the base model shown always, and live."""


def loop_settings(pairs: list[str]) -> tuple[TrainingLoopSettings, dict[str, Any]]:
    """The training loop's settings: the defaults with `KEY=VALUE` changes (camelCase or
    snake_case keys, values as JSON or plain strings); the changes as applied."""
    changes_ = setting_overrides(pairs)
    try:
        settings = TrainingLoopSettings.model_validate(changes_)
    except ValueError as exc:
        raise SystemExit(f"tabloop eval replay: --loop-setting: {exc}") from exc
    default = TrainingLoopSettings().model_dump()
    changed = {k: v for k, v in settings.model_dump().items() if v != default[k]}
    return settings, changed


def reveal_order(root: Path, rounds: int, seed: int) -> list[list[str]]:
    """The code base's code files (as the trainer reads them), shuffled by `seed` and cut into
    `rounds` parts of equal size (the first parts one larger when it does not divide)."""
    files = workspace_files(root)
    if len(files) < rounds:
        raise SystemExit(
            f"tabloop eval replay: {root} has {len(files)} code files, fewer than {rounds} rounds"
        )
    random.Random(seed).shuffle(files)
    size, extra = divmod(len(files), rounds)
    parts, start = [], 0
    for k in range(rounds):
        end = start + size + (k < extra)
        parts.append(sorted(files[start:end]))
        start = end
    return parts


@dataclass
class ReplayClock:
    """Real time plus the waits the server would make that the replay skips."""

    skipped_s: float = 0.0

    def now(self) -> float:
        return time.time() + self.skipped_s

    def skip(self, seconds: float) -> float:
        seconds = max(seconds, 0.0)
        self.skipped_s += seconds
        return seconds


@dataclass
class Workspace:
    """The revealed code base, its feedback store and its adapter registry."""

    root: Path
    store: FeedbackStore
    registry: AdapterRegistry
    record: LoopRecord = field(default_factory=LoopRecord)

    def serving_mark(self) -> int:
        """The newest feedback row the serving version trained through (0: none)."""
        try:
            serving = self.registry.serving()
            mark = mark_of(self.registry.get(serving).train) if serving is not None else None
        except AdapterRegistryError:
            mark = None
        return max(self.record.feedback_upto, mark[1] if mark is not None else 0)

    def material(self) -> Material:
        """What is new since the last run, counted as the server's training loop counts it."""
        new_feedback = self.store.count_after(self.serving_mark())
        started = self.record.last_started
        files = workspace_files(self.root)
        changed = sum(
            1 for rel in files if started is None or (self.root / rel).stat().st_mtime > started
        )
        running = self.registry.canary()
        canary = version_label(running.version) if running is not None else None
        return Material(new_feedback, changed, unfinished=False, canary=canary)


def _version_path(registry: AdapterRegistry, version: int | None) -> Path | None:
    return registry.path(version) if version is not None else None


def _serve(runner: CachedRunner, path: Path | None, served: list[Path | None]) -> float:
    """Swap the runner to `path` unless it serves it already; the seconds the swap took."""
    if served[0] == path:
        return 0.0
    started = time.perf_counter()
    runner.swap_adapter(path)
    served[0] = path
    return time.perf_counter() - started


def play_round(
    args: argparse.Namespace,
    loop: Loop,
    workspace: Workspace,
    runner: CachedRunner,
    settings: CompletionSettings,
    positions: list[Position],
    number: int,
    served: list[Path | None],
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Round `number` played live (sessions on their arms, events and feedback kept): its
    figures in `evaluate_policy`'s form, the versions that served, and its last event's time."""
    rewards = loop.scheduler.settings.rewards
    files = sorted({p.path for p in positions})
    sessions = [files[i :: args.sessions_per_round] for i in range(args.sessions_per_round)]
    tally, per_position = Tally(), {}
    versions: dict[str, int] = {}
    swaps: list[tuple[str, float]] = []
    last_event = 0.0
    policy = loop.policies.current()
    for index, session_files in enumerate(s for s in sessions if s):
        key = f"replay-{args.seed}-round{number}-session{index}"
        version = workspace.registry.serving_for(key)
        label = workspace_label(version)
        swaps.append(
            (label, round(_serve(runner, _version_path(workspace.registry, version), served), 2))
        )
        played = [p for p in positions if p.path in set(session_files)]
        engine = Engine(
            settings, runner, policy_source=loop.policies.current, seed=args.seed + 100 * number
        )
        player = Player(
            engine, loop.telemetry, rewards, args.min_partial_chars, feedback=workspace.store
        )
        player.model_version = label
        player.log = []
        session_tally = player.play(played)
        for position, (decision, response) in zip(played, player.log, strict=True):
            per_position[id(position)] = (
                reward_of(response, len(decision.text), rewards) if response is not None else 0.0
            )
        for name, value in vars(session_tally).items():
            setattr(tally, name, getattr(tally, name) + value)
        versions[label] = versions.get(label, 0) + session_tally.requests
        last_event = max(last_event, player.last_event_at)
    figures = {
        "version": policy.version,
        **{k: round(v, 4) for k, v in tally.report().items()},
        "position_rewards": [per_position[id(p)] for p in positions],
    }
    serving = {
        "policy": policy.version,
        "policy_canary_share": policy.share if isinstance(policy, CanaryPolicy) else None,
        "model_requests": versions,
        "swaps": swaps,
    }
    return figures, serving, last_event


def train_between_rounds(
    args: argparse.Namespace,
    workspace: Workspace,
    loop_settings_: TrainingLoopSettings,
    clock: ReplayClock,
    work: Path,
    number: int,
) -> dict[str, Any]:
    """What the server's training loop does after the round: a run if one is due, waited for."""
    waited = clock.skip(loop_settings_.idle_s) + clock.skip(loop_settings_.check_every_s)
    material = workspace.material()
    activity = Activity(0, loop_settings_.idle_s, 0.0)
    reason = wait_reason(loop_settings_, material, activity, workspace.record, clock.now())
    if reason is not None and reason.startswith("the minimum interval"):
        assert workspace.record.last_started is not None
        waited += clock.skip(
            workspace.record.last_started + loop_settings_.min_interval_s - clock.now()
        )
        reason = wait_reason(loop_settings_, material, activity, workspace.record, clock.now())
    report: dict[str, Any] = {
        "new_feedback": material.new_feedback,
        "changed_files": material.changed_files,
        "waits_s": round(waited, 1),
    }
    if reason is not None:
        return {**report, "ran": False, "waiting_for": reason}
    state = work / f"run{number}"
    state.mkdir(parents=True, exist_ok=True)
    command = train_command(
        workspace.root, loop_settings_, model=args.model, progress_file=state / "progress.jsonl"
    )
    env = child_environment(os.environ, loop_settings_.threads, configured_cache_dir(), ())
    workspace.record.last_started = clock.now()
    workspace.record.feedback_upto = workspace.store.last_id()
    launched_at, started = time.time(), time.perf_counter()
    child = TrainingChild.launch(
        command, env=env, stdout=state / "report.json", stderr=state / "train.log"
    )
    peak_rss = 0
    try:
        while (code := child.poll()) is None:
            peak_rss = max(peak_rss, child.rss_bytes())
            cap = loop_settings_.max_memory_mb
            if cap and peak_rss > cap * 2**20:
                code = child.stop(OVER_MEMORY)
                break
            time.sleep(POLL_S)
    except BaseException:  # the replay is stopping (Ctrl-C, SIGTERM): so is its run
        child.stop(INTERRUPTED)
        raise
    run_s = time.perf_counter() - started
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    try:
        run_report = json.loads((state / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run_report = None
    if code != 0 or not isinstance(run_report, dict):
        tail = (state / "train.log").read_text(encoding="utf-8", errors="replace")[-2000:]
        return {
            **report,
            "ran": True,
            "exit": code,
            "stopped_for": child.stopped_for,  # the memory cap, when it was this side
            "peak_rss_mb_sampled": round(peak_rss / 2**20),
            "run_s": round(run_s, 1),
            "log_tail": tail,
            "launched_at": launched_at,
        }
    outcome, why = outcome_of_report(run_report)
    return {
        **report,
        "ran": True,
        "launched_at": launched_at,
        "exit": code,
        "run_s": round(run_s, 1),
        "peak_rss_mb_sampled": round(peak_rss / 2**20),
        "outcome": outcome,
        "reason": why,
        "version": run_report.get("version"),
        "report": run_report,
    }


def run_continuous(
    args: argparse.Namespace,
    argv: list[str],
    loop: Loop,
    runner: CachedRunner,
    settings: CompletionSettings,
    work: Path,
) -> dict[str, Any]:
    """The replay over time; returns its report."""
    started = time.time()
    loop_settings_, changed = loop_settings(args.loop_setting)
    parts = reveal_order(args.train, args.rounds, args.seed)
    root = work / "workspace"
    root.mkdir()
    cache_dir = configured_cache_dir()
    store = FeedbackStore(cache_dir / FEEDBACK_FILE, workspace=root)
    registry = AdapterRegistry(scope_dir(cache_dir, workspace=root))
    workspace = Workspace(root, store, registry)
    rewards = loop.scheduler.settings.rewards
    clock = ReplayClock()
    served: list[Path | None] = [None]
    base_model = runner.model_id
    rounds: list[dict[str, Any]] = []
    plays: list[Play] = []
    pending: dict[str, Any] | None = None  # the last run, until its version serves

    def save_partial() -> None:
        """What is done so far, to `--out`: it survives a run cut short."""
        if args.out is not None:
            partial = _report(
                args, argv, rounds, plays, changed, loop_settings_, base_model, runner, started
            )
            args.out.write_text(json.dumps({**partial, "partial": True}, indent=2) + "\n")

    try:
        for number, part in enumerate(parts, start=1):
            for rel in part:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(args.train / rel, root / rel)
                now = clock.now()  # revealed now, on the clock runs are timed by
                os.utime(root / rel, (now, now))
            positions = sample_positions(
                root, args.round_positions, args.seed + number, keep=set(part).__contains__
            )
            # The baseline first: the base model, shown always, nothing reported or kept.
            _serve(runner, None, served)
            baseline = evaluate_policy(args, positions, runner, settings, always_show(), rewards)
            live, serving, last_event = play_round(
                args, loop, workspace, runner, settings, positions, number, served
            )
            if pending is not None and pending.get("outcome") == "promoted":
                # Served from the next round's first session on it: add the swap measured then.
                label = workspace_label(parse_version_label(pending["version"]))
                swaps = [s for name, s in serving["swaps"] if name == label]
                pending["event_to_serving_s"] = (
                    round(pending["to_run_end_s"] + swaps[0], 1) if swaps else None
                )
            delivered = deliver(loop.telemetry)
            newest = latest_event_id(loop.backend.storage, loop.tenant)
            policy_promoted, _, gate_run = await_training(loop, newest, last_event, args)
            canary = settle_local_canary(registry, store)
            entry: dict[str, Any] = {
                "round": number,
                "files_revealed": len(part),
                "positions": len(positions),
                "serving": serving,
                "delivered": delivered,
                "live": public(live),
                "base_always_show": public(baseline),
                "vs_base_always_show": _gains(changes(baseline, live)),
                "gate_run": {"promoted": policy_promoted, **gate_run},
                "model_canary": canary,
            }
            rounds.append(entry)
            plays.append((baseline, live))
            save_partial()
            if number == len(parts):
                break
            run = train_between_rounds(args, workspace, loop_settings_, clock, work, number)
            if run.get("outcome") == "promoted":
                # From the round's last event: the real time to the launch, the waits skipped,
                # the run; the swap follows when the version first serves.
                ended = run.pop("launched_at") + run["run_s"]
                run["to_run_end_s"] = round(ended - last_event + run["waits_s"], 1)
            else:
                run.pop("launched_at", None)
            entry["training"] = run
            pending = run
            save_partial()
            brief = {k: v for k, v in run.items() if k != "report"}
            log.warning("round %d: %s", number, json.dumps(brief)[:400])
    finally:
        store.close()
    return _report(args, argv, rounds, plays, changed, loop_settings_, base_model, runner, started)


def _gains(compared: dict[str, Any]) -> dict[str, Any]:
    """`changes` without the two plays' figures (the round gives them beside it)."""
    return {k: v for k, v in compared.items() if k not in ("baseline", "learned")}


def _pooled(plays: list[dict[str, Any]]) -> dict[str, Any]:
    """Plays on different positions as one: counts summed, rates over the summed shown, the
    per-position rewards end to end (what `changes` reads)."""
    total: dict[str, Any] = {}
    for name in ("requests", "suggestions", "shown", "accepted_chars", "retained_chars", "reward"):
        total[name] = sum(play[name] for play in plays)
    for rate in ("accept_rate", "full_accept_rate"):
        counted = sum(play[rate] * play["shown"] for play in plays)
        total[rate] = round(counted / total["shown"], 4) if total["shown"] else 0.0
    total["position_rewards"] = [r for play in plays for r in play["position_rewards"]]
    return total


def summarize(plays: list[Play]) -> dict[str, Any]:
    """The goals' figures: the rounds after the first (each served by what the loop had learned
    by then), pooled, against always-show with the base model on the same positions; the same
    for each round; and whether the last round gained more per position than the first."""

    def per_position(play: Play) -> float:
        base, live = play
        return (live["reward"] - base["reward"]) / max(live["requests"], 1)

    summary: dict[str, Any] = {}
    if len(plays) > 1:
        later = plays[1:]
        pooled = changes(_pooled([b for b, _ in later]), _pooled([live for _, live in later]))
        summary["rounds_after_the_first_vs_base_always_show"] = {
            "baseline": pooled["baseline"],
            "loop": pooled["learned"],
            **_gains(pooled),
        }
    summary["reward_gain_per_position_by_round"] = [round(per_position(p), 4) for p in plays]
    summary["last_round_better_than_first"] = per_position(plays[-1]) > per_position(plays[0])
    return summary


def training_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """What the loop's training did over `rounds`: the looks at whether a run was due (one after
    each round but the last), the runs that ran, those promoted, and each promoted version's
    delay from its round's last event to its first serving."""
    checks = [r["training"] for r in rounds if "training" in r]
    runs = [check for check in checks if check.get("ran")]
    delays = [r["event_to_serving_s"] for r in runs if r.get("event_to_serving_s") is not None]
    return {
        "training_checks": len(checks),
        "runs": len(runs),
        "promoted": sum(r.get("outcome") == "promoted" for r in runs),
        "event_to_serving_s": delays,
        "event_to_serving_max_s": max(delays) if delays else None,
    }


def _report(
    args: argparse.Namespace,
    argv: list[str],
    rounds: list[dict[str, Any]],
    plays: list[Play],
    changed: dict[str, Any],
    loop_settings_: TrainingLoopSettings,
    base_model: str,
    runner: CachedRunner,
    started: float,
) -> dict[str, Any]:
    return {
        "command": "tabloop eval replay " + " ".join(argv),
        "code_base": str(args.train),
        "model": base_model,
        "settings": {
            "engine": args.engine,
            "max_new_tokens": args.max_new_tokens,
            "context_tokens": args.context_tokens,
            "threads": args.threads,
            "round_positions": args.round_positions,
            "sessions_per_round": args.sessions_per_round,
            "train_interval_s": args.train_interval,
            "policy_refresh_s": args.refresh,
            "seed": args.seed,
            "training_loop": loop_settings_.model_dump(),
            "training_loop_changed_from_defaults": changed,
        },
        "model_cache": {"hits": runner.hits, "misses": runner.misses},
        "summary": {
            **summarize(plays),
            **training_summary(rounds),
        },
        "rounds": rounds,
        "wall_s": round(time.time() - started, 1),
    }
