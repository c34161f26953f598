"""`tabloop train model` and `tabloop model list|promote V|rollback|evaluate V`.

tabloop train model [--workspace DIR | --tenant T --db URL]
                    [--budget 20m | --samples N | --tokens N] [--replay-share 0.25]
                    [--held-out-share 0.2] [--promote] [--fresh] [--json]
                    [--base-dtype bfloat16] [--[no-]autocast] [--[no-]middle-only]
                    [--[no-]checkpointing] [--kl-weight 0] [--kl-reference start|base]
                    [--objective fim|kto] [--task both|completion|next-edit]
tabloop model list [--workspace DIR | --tenant T [--db URL] [--blob-url URL]] [--json]
tabloop model promote V [--force] [--margin M] [--canary-share S] [--workspace DIR | --tenant T …]
tabloop model approve V [--canary-share S] [--workspace DIR | --tenant T …]
tabloop model rollback [--workspace DIR | --tenant T …]
tabloop model evaluate V [--n 50] [--workspace DIR]
(each `tabloop model` action takes `--task next-edit` for the workspace's next-edit adapters)

A workspace's run lives in its adapter directory under the cache (`runs/current`): killed, it
resumes from its last checkpoint when the same command runs again; finished, its adapter becomes
a new candidate version, judged against the serving one on the held-out files and the held-out
outcomes (the text users kept, ignored suggestions), on the fast engine when that is the
configured one (`training.evaluate`; the report's `judging` says which and what it cost). A run
starts from the serving adapter's weights when they fit (else fresh, and the report says why)
and trains on the workspace's feedback since the serving version's mark, newest first, with a
replayed share of older feedback (`training.window`); the report's `window` gives the counts.
A promoted version reaches a running server without a restart (it follows the registry). It is
a canary first: a workspace's serves half of the language server's sessions and is judged on the
local feedback (`training.local_canary`), a tenant's serves `--canary-share` of the tenant's
installations and is judged by the backend on their decision events (`backend.adapters.canary`);
either is then promoted or rolled back by itself. `--canary-share 0` serves it at once; `rollback`
during a canary rolls the canary back.

`--task` chooses what a workspace's adapter learns: completions and next edits in one adapter
(`both`, the default), completions alone (`completion`), or next edits alone (`next-edit`: a
second track of versions with its own registry, trained on the workspace's git history and the
user's own edits and judged on held-out ones, `training.edit_track`). The language server's
loop trains the two tracks apart where next edits have a runner of their own.

With `--tenant T --db URL` the adapter is a backend tenant's, trained from the tenant's events
that carry text (telemetry level `full`; `backend/adapters/`) and kept in the tenant's registry in
the backend's database, its files in the backend's blob store (`--blob-url`, default the
backend's `adapters.blob_url` setting, else `adapter-blobs` in the cache directory).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from common.memory import release_memory
from completion.settings import CompletionSettings
from lsp_server import config
from training.background import ProgressLog
from training.budget import Budget, parse_duration
from training.canary import ModelCanarySettings
from training.edit_store import EditExampleStore
from training.edit_track import TASKS, edit_registry
from training.examples import split_files, workspace_files
from training.feedback import FEEDBACK_FILE, FeedbackStore
from training.local_canary import LOCAL_CANARY
from training.registry import (
    DEFAULT_MARGIN,
    RUN_DIR,
    AdapterRegistry,
    AdapterRegistryError,
    AdapterVersion,
    AdapterVersions,
    scope_dir,
)
from training.trainer import Progress, TrainResult, TrainSettings
from training.window import DEFAULT_HELD_OUT_SHARE, DEFAULT_REPLAY_SHARE, WindowSettings


def _scope(parser: argparse.ArgumentParser, tenant: bool = True) -> None:
    parser.add_argument("--workspace", help="workspace root (default: the current directory)")
    if tenant:
        parser.add_argument("--tenant", help="a backend tenant's adapters instead of a workspace's")
        parser.add_argument("--db", help="tenant: the backend's database URL")
        parser.add_argument(
            "--blob-url",
            help="tenant: where the backend stores adapter files (default: its "
            "adapters.blob_url setting, TABLOOP_BACKEND_ADAPTERS__BLOB_URL)",
        )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="both",
        help="a workspace's adapters: next-edit for its next-edit track (default: the "
        "completion adapters, which learn next edits too unless trained with --task completion)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def _edit_track(args: argparse.Namespace) -> bool:
    """Whether the command is about the workspace's next-edit track (refused for a tenant)."""
    if args.task != "next-edit":
        return False
    if getattr(args, "tenant", None):
        raise SystemExit("tabloop: --task next-edit is a workspace's track, not a tenant's")
    return True


def _blob_url(args: argparse.Namespace) -> str | None:
    """The backend's blob store of adapter files: `--blob-url`, else its setting."""
    if args.blob_url:
        return str(args.blob_url)
    from backend.settings import BackendSettings

    return BackendSettings().adapters.blob_url


def _resolved(args: argparse.Namespace) -> tuple[Path, config.Settings, Path]:
    workspace = Path(args.workspace or ".").resolve()
    settings = config.resolve(workspace).settings
    return workspace, settings, settings.cache_path()


def _registry(args: argparse.Namespace) -> AdapterVersions:
    if getattr(args, "tenant", None):
        if args.workspace:
            raise SystemExit("tabloop model: --workspace or --tenant, not both")
        from backend.adapters.run import tenant_registry
        from backend.storage import Storage, default_db_url
        from common.config import configured_cache_dir

        storage = Storage(args.db or default_db_url())
        try:
            return tenant_registry(storage, configured_cache_dir(), args.tenant, _blob_url(args))
        except ValueError as exc:
            raise SystemExit(f"tabloop model: {exc}") from None
    if getattr(args, "db", None) or getattr(args, "blob_url", None):
        raise SystemExit("tabloop model: --db and --blob-url go with --tenant")
    workspace, _settings, cache_dir = _resolved(args)
    if _edit_track(args):
        return edit_registry(cache_dir, workspace)
    return AdapterRegistry(scope_dir(cache_dir, workspace=workspace))


def _budget(args: argparse.Namespace) -> Budget:
    seconds = parse_duration(args.budget) if args.budget else None
    if seconds is None and args.samples is None and args.tokens is None:
        seconds = parse_duration("20m")
    return Budget(samples=args.samples, tokens=args.tokens, seconds=seconds)


class _Bar:
    """The terminal progress bar: budget used, samples/s, loss."""

    def __init__(self, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=1000, disable=not enabled, unit="‰", file=sys.stderr)

    def __call__(self, p: Progress) -> None:
        self.bar.n = int(p.fraction * 1000)
        self.bar.set_postfix(
            step=p.step, samples=p.samples, loss=f"{p.loss:.3f}", rate=f"{p.samples_per_s:.2f}/s"
        )

    def close(self) -> None:
        self.bar.close()


class _RunProgress:
    """A run's progress: the terminal bar, and each step in `--progress-file` when asked (what
    the language server's background runs read)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.bar = _Bar(enabled=not args.json)
        self.steps = ProgressLog(Path(args.progress_file)) if args.progress_file else None

    def __call__(self, progress: Progress) -> None:
        self.bar(progress)
        if self.steps is not None:
            self.steps.training(progress)

    def judging(self) -> None:
        if self.steps is not None:
            self.steps.judging()

    def close(self) -> None:
        if self.steps is not None:
            self.steps.close()


def _register(registry: AdapterRegistry, result: TrainResult, run_dir: Path) -> AdapterVersion:
    """A finished run's adapter as the registry's next version; the run directory goes (the
    next run starts fresh)."""
    from completion.adapters import read_manifest

    manifest = read_manifest(Path(result.adapter))
    record = registry.add(Path(result.adapter), manifest["base_model"], asdict(result))
    shutil.rmtree(run_dir, ignore_errors=True)
    return record


def _objective_flags(parser: argparse.ArgumentParser) -> None:
    """What a training step computes and in which precision (`TrainSettings`, docs/learning.md)."""
    from training.objective import REFERENCES
    from training.trainer import BASE_DTYPES, OBJECTIVES

    defaults = TrainSettings()
    on_off = argparse.BooleanOptionalAction
    parser.add_argument(
        "--base-dtype",
        choices=("auto", *BASE_DTYPES),
        default="auto",
        help="the frozen base model's weights (the LoRA weights are float32); auto: bfloat16 "
        f"where the CPU computes it natively (here: {defaults.base_dtype})",
    )
    parser.add_argument(
        "--autocast",
        action=on_off,
        default=None,
        help=f"bfloat16 autocast (default: where the CPU computes it natively; here: "
        f"{'on' if defaults.autocast else 'off'})",
    )
    parser.add_argument(
        "--middle-only",
        action=on_off,
        default=defaults.middle_only,
        help="the LM head only at the positions that predict the middle's tokens",
    )
    parser.add_argument(
        "--checkpointing",
        action=on_off,
        default=defaults.checkpointing,
        help="activation checkpointing (recompute layers in the backward pass)",
    )
    parser.add_argument(
        "--checkpointing-every",
        type=int,
        default=defaults.checkpointing_every,
        metavar="N",
        help=f"checkpoint every N-th decoder layer (default {defaults.checkpointing_every})",
    )
    parser.add_argument(
        "--kl-weight",
        type=float,
        default=defaults.kl_weight,
        help="weight of the KL anchor to the reference model (0: none; off by default: "
        "docs/learning.md, 'Which objective')",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=defaults.objective,
        help="fim: this trainer's loss on code and feedback; kto: trl's KTOTrainer on the "
        "window's accepted and rejected suggestions against the base model (one pass, not "
        "resumable)",
    )
    parser.add_argument(
        "--edit-token-weight",
        type=float,
        default=defaults.edit_token_weight,
        help="next-edit examples: the weight of the tokens an edit changes against those it "
        "copies from the window",
    )
    parser.add_argument(
        "--kl-reference",
        choices=REFERENCES,
        default=defaults.kl_reference,
        help="the KL anchor's reference: the adapter the run starts from, or the base model",
    )


def trainer_flags(parser: argparse.ArgumentParser) -> None:
    """The budget, the base model and the trainer's settings (`train model`, `train edits`)."""
    from training.workspace import EDIT_PROMPT_TOKENS

    parser.add_argument("--budget", help="wall-clock budget, e.g. 20m (the default), 1h, 90s")
    parser.add_argument("--samples", type=int, help="budget in training examples")
    parser.add_argument("--tokens", type=int, help="budget in tokens (prompt and target)")
    parser.add_argument("--model", help="base model (default: the configured completion.model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--effective-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=0, help="0: sized from free memory")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=384, help="a completion example's prompt"
    )
    parser.add_argument(
        "--max-edit-prompt-tokens",
        type=int,
        default=0,
        help=f"a next-edit example's prompt (0: {EDIT_PROMPT_TOKENS} where the run reads them)",
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    _objective_flags(parser)


def train_settings_of(args: argparse.Namespace) -> TrainSettings:
    """The `TrainSettings` of `trainer_flags`' arguments (ValueError for a bad combination)."""
    from training.lora import LoraShape

    return TrainSettings(
        seed=args.seed,
        learning_rate=args.learning_rate,
        effective_batch=args.effective_batch,
        micro_batch=args.micro_batch,
        checkpoint_every=args.checkpoint_every,
        max_prompt_tokens=args.max_prompt_tokens,
        max_edit_prompt_tokens=args.max_edit_prompt_tokens,
        lora=LoraShape(rank=args.rank, alpha=2 * args.rank),
        base_dtype=args.base_dtype,
        autocast=args.autocast,
        middle_only=args.middle_only,
        checkpointing=args.checkpointing,
        checkpointing_every=args.checkpointing_every,
        kl_weight=args.kl_weight,
        kl_reference=args.kl_reference,
        objective=args.objective,
        edit_token_weight=args.edit_token_weight,
    )


def train_model_main(argv: list[str]) -> int:
    """Entry point of `tabloop train model`."""
    parser = argparse.ArgumentParser(
        prog="tabloop train model",
        description="Train a LoRA adapter of the completion model on a workspace's code and its "
        "local feedback, evaluate it on held-out files, and add it to the adapter registry.",
    )
    _scope(parser)
    trainer_flags(parser)
    parser.add_argument("--eval-n", type=int, default=50, help="held-out cursors; 0 skips")
    parser.add_argument(
        "--replay-share",
        type=float,
        default=DEFAULT_REPLAY_SHARE,
        help="share of the feedback trained on that replays outcomes older than the serving "
        "version's mark",
    )
    parser.add_argument(
        "--held-out-share",
        type=float,
        default=DEFAULT_HELD_OUT_SHARE,
        help="share of the new outcomes, the newest, held out to judge the version",
    )
    parser.add_argument("--promote", action="store_true", help="promote if the evaluation allows")
    parser.add_argument("--fresh", action="store_true", help="discard an unfinished run")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    parser.add_argument(
        "--progress-file",
        help="append each step, and the turn to judging, to this file as a JSON object a line "
        "(what the language server's background runs read)",
    )
    parser.add_argument(
        "--min-examples",
        type=int,
        default=50,
        help="tenant: fewest training examples (text-carrying events with an outcome) to train",
    )
    args = parser.parse_args(argv)
    args.command = "tabloop train model " + " ".join(argv)  # in the report
    try:
        budget = _budget(args)
        window = WindowSettings(args.replay_share, args.held_out_share)
        train_settings = train_settings_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.tenant and args.objective != "fim":
        parser.error("--objective kto trains a workspace's adapter; a tenant's uses fim")
    if args.tenant and args.task != "both":
        parser.error("--task trains a workspace's adapters; a tenant's learns completions")
    if args.tenant:
        return _train_tenant(args, parser, budget, train_settings, window)
    if args.db or args.blob_url:
        parser.error("--db and --blob-url go with --tenant")
    if args.task == "next-edit":
        if args.objective != "fim":
            parser.error("--task next-edit trains with the fim objective")
        return _train_next_edits(args, budget, train_settings)
    from training.workspace import train_workspace

    workspace, settings, cache_dir = _resolved(args)
    registry = AdapterRegistry(scope_dir(cache_dir, workspace=workspace))
    run_dir = registry.root / RUN_DIR
    if args.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    feedback = FeedbackStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
    # The next-edit examples the language server kept from this workspace's editing.
    edits = EditExampleStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
    progress = _RunProgress(args)
    model = args.model or settings.completion.model
    try:
        result, held_out = train_workspace(
            workspace,
            model=model,
            cache_dir=cache_dir,
            work_dir=run_dir,
            budget=budget,
            settings=train_settings,
            feedback=feedback,
            edits=edits if args.task == "both" else None,
            exclude=settings.index.exclude,
            on_progress=progress,
            device=args.device,
            registry=registry,
            window=window,
        )
    except ValueError as exc:
        edits.close()
        raise SystemExit(f"tabloop train model: {exc}") from None
    finally:
        progress.bar.close()
    record = _register(registry, result, run_dir)
    report: dict[str, Any] = {
        "command": args.command,
        "version": record.name,
        "window": result.window,
        "warm_start": result.warm_start,
        "edit_examples": result.edit_examples,
        "training": asdict(result),
    }
    if unattributed := feedback.unattributed():
        report["feedback_without_workspace"] = unattributed
    if args.eval_n > 0 and held_out:
        progress.judging()
        release_memory()  # the trained model's memory, before the judging merges and converts
        report["evaluation"] = _evaluate(
            registry,
            record.version,
            workspace,
            held_out,
            settings,
            model,
            cache_dir,
            args.eval_n,
            feedback,
            edits,
        )
    edits.close()
    if args.promote and "evaluation" in report:
        try:
            report["promoted"] = registry.promote(
                record.version, canary_share=LOCAL_CANARY.share, actor="trainer"
            )
        except AdapterRegistryError as exc:
            report["not_promoted"] = str(exc)
    feedback.close()
    progress.close()
    _print(report, args.json)
    return 0


def _train_next_edits(args: argparse.Namespace, budget: Budget, settings: TrainSettings) -> int:
    """`tabloop train model --task next-edit`: the workspace's next-edit adapter, judged against
    the next-edit version serving (or the base model) and promoted at once when it gains."""
    from training.edit_track import train_workspace_edits

    workspace, config_settings, cache_dir = _resolved(args)
    registry = edit_registry(cache_dir, workspace)
    run_dir = registry.root / RUN_DIR
    if args.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    edits = EditExampleStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
    progress = _RunProgress(args)
    model = args.model or config_settings.completion.model
    try:
        result = train_workspace_edits(
            workspace,
            model=model,
            cache_dir=cache_dir,
            work_dir=run_dir,
            budget=budget,
            settings=settings,
            edits=edits,
            registry=registry,
            next_edit=config_settings.next_edit,
            on_progress=progress,
            device=args.device,
        )
    except ValueError as exc:
        edits.close()
        raise SystemExit(f"tabloop train model: {exc}") from None
    finally:
        progress.bar.close()
    record = _register(registry, result, run_dir)
    report: dict[str, Any] = {
        "command": args.command,
        "task": "next-edit",
        "version": record.name,
        "warm_start": result.warm_start,
        "edit_examples": result.edit_examples,
        "training": asdict(result),
    }
    if args.eval_n > 0:
        progress.judging()
        release_memory()
        evaluation = _evaluate_edits(
            registry,
            record.version,
            workspace,
            config_settings,
            model,
            cache_dir,
            args.eval_n,
            edits,
        )
        if evaluation is not None:
            report["evaluation"] = evaluation
    edits.close()
    if args.promote and "evaluation" in report:
        try:
            # No canary: the local canary judges completions' outcomes, not next edits'.
            report["promoted"] = registry.promote(record.version, actor="trainer")
        except AdapterRegistryError as exc:
            report["not_promoted"] = str(exc)
    progress.close()
    _print(report, args.json)
    return 0


def _judged(
    registry: AdapterVersions, version: int
) -> tuple[dict[str, Any], int | None, dict[str, Any] | None]:
    """`version`'s training record, the serving version, and that one's training record."""
    serving = registry.serving()
    serving_train = registry.get(serving).train if serving is not None else None
    return registry.get(version).train, serving, serving_train


def _judging_settings(settings: config.Settings, model: str) -> CompletionSettings:
    """The completion settings a version is judged with: `model`, no named adapter, and time
    to gather each cursor's context."""
    return settings.completion.model_copy(
        update={"model": model, "adapter": "", "context_timeout_ms": 60_000}
    )


def _evaluate_edits(
    registry: AdapterVersions,
    version: int,
    workspace: Path,
    settings: config.Settings,
    model: str,
    cache_dir: Path,
    n: int,
    edits: EditExampleStore | None,
) -> dict[str, Any] | None:
    """A next-edit version against the serving one (or the base model) on up to `n` of the
    user's held-out examples and `n` of its held-out commits' (None: it held none out)."""
    from training.edit_track import judged_examples
    from training.evaluate import (
        HeldOutOutcomes,
        compare,
        held_out_edits,
        judging_cost,
        judging_runner,
    )

    started = time.perf_counter()
    train, serving, serving_train = _judged(registry, version)
    completion = _judging_settings(settings, model)
    runner = judging_runner(completion, cache_dir)
    try:
        examples = held_out_edits(edits, train, serving_train, limit=n) + tuple(
            judged_examples(train, workspace, n, runner.count_tokens, settings.next_edit)
        )
        if not examples:
            return None
        report = compare(
            runner,
            completion,
            registry.serving_path(),
            registry.path(version),
            [],
            HeldOutOutcomes(edits=examples),
        )
    finally:
        runner.close()
    report["task"] = "next-edit"
    report["against"] = serving
    report["judging"] = judging_cost(report["engine"], time.perf_counter() - started, train)
    registry.record_evaluation(version, report)
    return report


def _train_tenant(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    budget: Budget,
    train_settings: TrainSettings,
    window: WindowSettings,
) -> int:
    """`tabloop train model --tenant T --db URL`: the tenant's adapter, from its events."""
    from backend.adapters.run import TenantRunOptions, TenantTrainingError, train_tenant
    from backend.storage import Storage, default_db_url
    from common.config import configured_cache_dir

    if args.workspace:
        parser.error("--workspace or --tenant, not both")
    try:
        scope_dir(Path("."), tenant=args.tenant)
    except ValueError as exc:
        parser.error(str(exc))
    options = TenantRunOptions(
        model=args.model or config.resolve(None).settings.completion.model,
        budget=budget,
        settings=train_settings,
        min_examples=args.min_examples,
        eval_n=args.eval_n,
        promote=args.promote,
        fresh=args.fresh,
        device=args.device,
        window=window,
        blob_url=_blob_url(args),
    )
    storage = Storage(args.db or default_db_url())
    bar = _Bar(enabled=not args.json)
    try:
        report = train_tenant(
            storage, args.tenant, configured_cache_dir(), options, on_progress=bar
        )
    except TenantTrainingError as exc:
        print(f"tabloop train model: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
        storage.close()
    _print({"command": args.command, **report}, args.json)
    return 0


def _evaluate(
    registry: AdapterVersions,
    version: int,
    workspace: Path,
    held_out: list[str],
    settings: config.Settings,
    model: str,
    cache_dir: Path,
    n: int,
    feedback: FeedbackStore | None,
    edits: EditExampleStore | None = None,
) -> dict[str, Any]:
    from training.evaluate import (
        compare,
        held_out_cursors,
        held_out_edits,
        held_out_outcomes,
        judging_cost,
        judging_runner,
    )

    started = time.perf_counter()
    train, _serving, serving_train = _judged(registry, version)
    cursors = held_out_cursors(workspace, held_out, n, seed=0)
    outcomes = replace(
        held_out_outcomes(feedback, train, limit=n),
        edits=held_out_edits(edits, train, serving_train, limit=n),
    )
    completion = _judging_settings(settings, model)
    runner = judging_runner(completion, cache_dir)
    try:
        report = compare(
            runner, completion, registry.serving_path(), registry.path(version), cursors, outcomes
        )
    finally:
        runner.close()
    report["against"] = registry.serving()
    report["judging"] = judging_cost(report["engine"], time.perf_counter() - started, train)
    registry.record_evaluation(version, report)
    return report


def _canary_share(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--canary-share",
        type=float,
        help="share of clients the version serves first (0: all at once; default: a "
        f"workspace's {LOCAL_CANARY.share:g} of sessions, a tenant's "
        f"{ModelCanarySettings().share:g} of installations)",
    )


def _share(args: argparse.Namespace) -> float:
    if args.canary_share is not None:
        if not 0.0 <= args.canary_share <= 1.0:
            raise SystemExit("tabloop model: --canary-share must be in [0, 1]")
        return float(args.canary_share)
    return ModelCanarySettings().share if getattr(args, "tenant", None) else LOCAL_CANARY.share


def _print(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    for key, value in report.items():
        print(f"{key}: {json.dumps(value, default=str)}")


def model_main(argv: list[str]) -> int:
    """Entry point of `tabloop model`."""
    parser = argparse.ArgumentParser(prog="tabloop model", description="adapter versions")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("list", help="versions, their evaluation, which one serves")
    _scope(p)
    p = sub.add_parser("promote", help="serve a version (if its evaluation shows a gain)")
    p.add_argument("version", help="v0003 or 3")
    p.add_argument("--force", action="store_true", help="promote without an evaluated gain")
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="how far above zero the exact-line gain's 95%% lower bound must be",
    )
    _canary_share(p)
    _scope(p)
    p = sub.add_parser("approve", help="release a version waiting for approval")
    p.add_argument("version", help="v0003 or 3")
    _canary_share(p)
    _scope(p)
    p = sub.add_parser("rollback", help="roll the canary back, else serve the previous version")
    _scope(p)
    p = sub.add_parser("evaluate", help="evaluate a version against the serving one")
    p.add_argument("version")
    p.add_argument("--n", type=int, default=50)
    _scope(p, tenant=False)
    args = parser.parse_args(argv)
    registry = _registry(args)
    try:
        if args.action == "list":
            serving = registry.serving()
            rows = [
                {**asdict(v), "name": v.name, "serving": v.version == serving}
                for v in registry.versions()
            ]
            canary = registry.canary()
            if args.json:
                state = {
                    "serving": serving,
                    "canary": asdict(canary) if canary is not None else None,
                    "pending": registry.pending(),
                    "transitions": registry.transitions(),
                    "versions": rows,
                }
                print(json.dumps(state, indent=2))
            else:
                print(f"serving: {'base model' if serving is None else f'v{serving:04d}'}")
                if canary is not None:
                    print(f"canary: v{canary.version:04d} at {canary.share:.0%}")
                for row in rows:
                    evaluation = row.get("evaluation") or {}
                    gain = evaluation.get("edit_similarity_difference", {}).get("mean")
                    print(f"{row['name']}  {row['status']:<9}  edit-similarity gain {gain}")
            return 0
        version = int(str(getattr(args, "version", "0")).lstrip("v") or 0)
        if args.action == "promote":
            share = _share(args)
            reason = registry.promote(
                version, margin=args.margin, force=args.force, canary_share=share
            )
            print(f"v{version:04d} {'is a canary' if 0 < share < 1 else 'serves'} ({reason})")
        elif args.action == "approve":
            became = registry.approve(version, canary_share=_share(args))
            print(f"v{version:04d} approved: {became}")
        elif args.action == "rollback":
            previous = registry.rollback()
            print(f"now serving: {'base model' if previous is None else f'v{previous:04d}'}")
        elif args.action == "evaluate" and _edit_track(args):
            workspace, settings, cache_dir = _resolved(args)
            registry.get(version)
            edits = EditExampleStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
            found = _evaluate_edits(
                registry,
                version,
                workspace,
                settings,
                settings.completion.model,
                cache_dir,
                args.n,
                edits,
            )
            edits.close()
            if found is None:
                print(f"tabloop model evaluate: v{version:04d} held out no next edits")
                return 1
            _print({"command": "tabloop model " + " ".join(argv), **found}, args.json)
        elif args.action == "evaluate":
            workspace, settings, cache_dir = _resolved(args)
            _train, held_out = split_files(workspace_files(workspace, settings.index.exclude))
            registry.get(version)  # an unknown version fails before the model loads
            model = settings.completion.model
            feedback = FeedbackStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
            edits = EditExampleStore(cache_dir / FEEDBACK_FILE, workspace=workspace)
            report = _evaluate(
                registry,
                version,
                workspace,
                held_out,
                settings,
                model,
                cache_dir,
                args.n,
                feedback,
                edits,
            )
            feedback.close()
            edits.close()
            _print({"command": "tabloop model " + " ".join(argv), **report}, args.json)
    except AdapterRegistryError as exc:
        print(f"tabloop model {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
