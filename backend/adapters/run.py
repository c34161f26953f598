"""One adapter training run for a tenant: its examples, the trainer, evaluation, the registry.

The tenant's versions are in the database, their files in the blob store
(`backend.adapters.registry`); the run lives in the tenant's local directory under this
machine's cache directory (`scope_dir(cache, tenant=T)/runs/current`):
the newest event row it reads, the serving version's mark and the version it warm-starts from
are fixed when it first starts (`training.workspace.RunPlan`; `events-upto` beside it tells the
scheduler a run is under way), and its checkpoints are written there, so a run killed at any
point resumes from its last checkpoint with the same examples in the same order. It trains on the
training window since the serving version's mark (`training.window`), starting from the serving
adapter's weights when they fit. Finished, its adapter becomes a candidate version of the tenant's
registry, evaluated against the serving version on the held-out events (does each reproduce
the accepted suggestions in their logged prompts: exact-line match and edit similarity, paired),
and promoted only by the registry's rule: into a canary at `canary_share` of the tenant's
clients (judged live by `backend.adapters.canary`), or held for approval for a tenant that
requires it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.adapters.dataset import TenantExamples, newest_event_row
from backend.adapters.registry import TenantAdapterRegistry, TenantAdapters
from backend.adapters.shards import SHARDS, epochs_for, export_window
from backend.storage import Storage
from training.budget import Budget
from training.registry import RUN_DIR, AdapterRegistryError, AdapterVersions
from training.streamed import rank_stream
from training.trainer import Progress, TrainSettings
from training.window import WindowSettings
from training.workspace import RunPlan

MARK_FILE = "events-upto"
TRAINER = "trainer"
"""Who the registry's log says acted on a run's promotion."""
DEFAULT_MIN_EXAMPLES = 50


class TenantTrainingError(ValueError):
    """A tenant's adapter cannot be trained (unknown tenant, no text-carrying events, too few
    examples); the message says why."""


@dataclass(frozen=True)
class TenantRunOptions:
    """What a run of a tenant's adapter needs besides the tenant."""

    model: str
    budget: Budget
    settings: TrainSettings
    min_examples: int = DEFAULT_MIN_EXAMPLES
    eval_n: int = 50
    promote: bool = False
    fresh: bool = False
    device: str | None = None
    window: WindowSettings = field(default_factory=WindowSettings)
    canary_share: float = 0.0
    """A promoted version serves this share of the tenant's clients first (0: all at once)."""
    blob_url: str | None = None
    """Where the adapter files are stored (`backend.adapters.blobs`; None: under the cache)."""
    processes: int = 1
    """Processes that train the run on this machine (more than 1: under torchrun,
    `backend.adapters.launch`; the database must be one they can all open)."""


def tenant_registry(
    storage: Storage,
    cache_dir: Path,
    tenant: str,
    blob_url: str | None = None,
    *,
    tenant_id: int | None = None,
) -> TenantAdapterRegistry:
    """The registry of tenant `tenant`'s adapters, its files at `blob_url` (None: the store
    under `cache_dir`); ValueError for an unknown tenant or a name no tenant directory may
    have."""
    return TenantAdapters.open(storage, cache_dir, blob_url).registry(tenant, tenant_id)


def last_trained_event(registry: AdapterVersions) -> int:
    """The newest event row the tenant's newest adapter version was trained up to (0: none)."""
    marks = [int(v.train.get("through_event_id", 0) or 0) for v in registry.versions()]
    return max(marks, default=0)


def release_version(
    registry: AdapterVersions,
    storage: Storage,
    tenant_id: int,
    version: int,
    canary_share: float,
    actor: str,
    *,
    force: bool = False,
) -> str:
    """Promote a tenant's evaluated `version` by the registry's rule (`AdapterRegistryError`
    when refused): it waits for approval for a tenant that requires it, else becomes a canary
    at `canary_share` of the tenant's clients (0: serves them all at once). Returns why."""
    return registry.promote(
        version,
        force=force,
        canary_share=canary_share,
        hold=storage.requires_approval(tenant_id),
        actor=actor,
    )


def train_tenant(
    storage: Storage,
    tenant: str,
    cache_dir: Path,
    options: TenantRunOptions,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    publish: Callable[[Callable[[], Any]], Any] | None = None,
) -> dict[str, Any]:
    """Train, evaluate and register an adapter for `tenant`; the run's report.

    `publish`, when given, wraps each registry write (a cluster trainer checks there that its
    job is still its own). Raises `TenantTrainingError` when there is nothing to train on.
    """
    tenant_id = storage.tenant_id(tenant)
    if tenant_id is None:
        raise TenantTrainingError(f"unknown tenant {tenant!r}")
    registry = tenant_registry(storage, cache_dir, tenant, options.blob_url, tenant_id=tenant_id)
    run_dir = registry.root / RUN_DIR
    if options.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    try:
        plan = RunPlan.load(run_dir) or RunPlan.new(registry, newest_event_row(storage, tenant_id))
    except ValueError as exc:  # a damaged plan: the message says to start afresh
        raise TenantTrainingError(f"tenant {tenant!r}: {exc}") from None
    upto = plan.upto
    data = TenantExamples(storage, tenant_id, upto, mark=plan.mark, window=options.window)
    if data.text_events == 0:
        raise TenantTrainingError(
            f"tenant {tenant!r} has no shown suggestions that carry text: editors send the "
            'prompt and the suggestion only at telemetry level "full" (telemetry.level = '
            '"full" in their settings)'
        )
    if data.train_count < options.min_examples:
        raise TenantTrainingError(
            f"tenant {tenant!r}: too few examples ({data.train_count} to train on, "
            f"{data.held_out_count} held out; at least {options.min_examples} needed): "
            f"skipped {dict(data.skipped.most_common())}"
        )
    plan.save(run_dir)  # only now: a run refused above leaves no run behind
    (run_dir / MARK_FILE).write_text(f"{upto}\n")

    from completion.adapters import read_manifest
    from training.workspace import load_trainable

    warm = plan.warm_source(registry)
    # The window as shards, read by every process from the same place (a resumed run reuses
    # them without reading the event store again).
    export_window(
        storage,
        tenant_id,
        upto,
        plan.mark,
        options.window,
        options.settings.seed,
        run_dir / SHARDS,
        epochs=epochs_for(options.budget, data.train_count),
        data=data,
    )
    if options.processes > 1:
        from backend.adapters.launch import run_launched

        result = run_launched(
            options.processes,
            database_url=storage.url,
            tenant=tenant,
            model=options.model,
            cache_dir=cache_dir,
            run_dir=run_dir,
            settings=options.settings,
            budget=options.budget,
            window=options.window,
            warm=warm,
            device=options.device,
        )
    else:
        trainable = load_trainable(options.model, cache_dir, options.settings, warm)
        trainer = trainable.trainer(options.settings, run_dir, options.device)
        result = trainer.run(rank_stream(run_dir / SHARDS), options.budget, on_progress)
        result.warm_start = trainable.warm_start.summary()
        del trainer, trainable  # the evaluation loads the model for serving
    result.window = data.window.summary()
    manifest = read_manifest(Path(result.adapter))
    train = {**asdict(result), "tenant": tenant, "through_event_id": upto}
    train["examples"] = data.summary()
    write = publish or (lambda action: action())
    record = write(lambda: registry.add(Path(result.adapter), manifest["base_model"], train))
    shutil.rmtree(run_dir, ignore_errors=True)  # finished: the next run starts fresh
    report: dict[str, Any] = {
        "tenant": tenant,
        "version": record.name,
        "window": result.window,
        "warm_start": result.warm_start,
        "examples": train["examples"],
        "training": asdict(result),
    }
    accepted = data.held_out_accepted(options.eval_n) if options.eval_n > 0 else []
    if accepted:
        evaluation = evaluate_on_events(
            registry, record.version, options.model, cache_dir, accepted
        )
        write(lambda: registry.record_evaluation(record.version, evaluation))
        report["evaluation"] = evaluation
    else:
        report["not_evaluated"] = (
            "evaluation skipped (--eval-n 0)"
            if options.eval_n <= 0
            else "no accepted suggestions among the held-out events"
        )
    if options.promote and "evaluation" in report:
        try:
            report["promoted"] = write(
                lambda: release_version(
                    registry, storage, tenant_id, record.version, options.canary_share, TRAINER
                )
            )
        except AdapterRegistryError as exc:
            report["not_promoted"] = str(exc)
    report["serving"] = registry.serving()
    canary = registry.canary()
    report["canary"] = asdict(canary) if canary is not None else None
    return report


def evaluate_on_events(
    registry: AdapterVersions,
    version: int,
    model: str,
    cache_dir: Path,
    accepted: list[Any],
) -> dict[str, Any]:
    """The serving version against `version` on held-out accepted suggestions: each completes
    every logged prompt, scored against the suggestion the user accepted there. Judged on the
    configured fast engine where it loads (`training.evaluate.judging_runner`), else torch."""
    import time

    from completion.settings import CompletionSettings
    from training.evaluate import compare, judging_cost, judging_runner

    started = time.perf_counter()
    settings = CompletionSettings(model=model, adapter="", context_timeout_ms=60_000)
    runner = judging_runner(settings, cache_dir)
    try:
        report = compare(
            runner, settings, registry.serving_path(), registry.path(version), accepted
        )
    finally:
        runner.close()
    # Here every cursor is a replayed accepted suggestion: exact-line match is the share of
    # accepted first lines reproduced.
    report["replay_accepted_first_line"] = {
        name: report[name]["exact_line_match"] for name in ("serving", "candidate")
    }
    report["cursors"] = "held-out accepted suggestions"
    report["judging"] = judging_cost(
        report["engine"], time.perf_counter() - started, registry.get(version).train
    )
    report["against"] = registry.serving()
    return report
