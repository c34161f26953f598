"""A tenant's run on 2 processes (`TenantRunOptions.processes`, torchrun, gloo): registered like a
run in one process, with the same adapter within the order of the sums."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from backend.adapters.run import TenantRunOptions, tenant_registry, train_tenant
from backend.adapters.scheduler import AdapterSchedule
from completion.adapters import WEIGHTS
from tests.backend.adapters.events import logged, post
from tests.support.backend_server import BackendServer
from training.budget import Budget
from training.lora import LoraShape
from training.trainer import TrainSettings

# No LoRA dropout: each process draws its own masks.
SETTINGS = TrainSettings(
    micro_batch=1,
    effective_batch=4,
    checkpoint_every=1,
    max_prompt_tokens=64,
    lora=LoraShape(rank=4, alpha=8, dropout=0.0),
)


def test_a_tenant_run_on_two_processes_matches_one(
    sqlite_backend: BackendServer, tiny_model_path: Path, tmp_path: Path
) -> None:
    post(sqlite_backend, logged(40))
    tenant = sqlite_backend.principal.tenant
    weights = {}
    for version, processes in ((1, 2), (2, 1)):  # one registry in the database: v0001, v0002
        options = TenantRunOptions(
            model=str(tiny_model_path),
            budget=Budget(samples=8),
            settings=SETTINGS,
            min_examples=10,
            eval_n=0,
            device="cpu",
            processes=processes,
        )
        cache = tmp_path / f"cache-{processes}"
        report = train_tenant(sqlite_backend.storage, tenant, cache, options)
        assert report["version"] == f"v{version:04d}"
        assert report["training"]["processes"] == processes
        assert report["training"]["steps"] == 2 and report["training"]["samples"] == 8
        assert report["warm_start"]["fresh"] is True
        assert report["window"] is not None
        registry = tenant_registry(sqlite_backend.storage, cache, tenant)
        weights[processes] = load_file(str(registry.path(version) / WEIGHTS))
    assert weights[1].keys() == weights[2].keys() and weights[1]
    assert any(t.abs().max() > 0 for name, t in weights[2].items() if "lora_B" in name)
    for name in weights[1]:
        assert torch.allclose(weights[1][name], weights[2][name], rtol=0, atol=1e-6), name


def test_the_schedule_sets_the_process_count_of_its_runs() -> None:
    assert AdapterSchedule.model_validate({}).options().processes == 1
    assert AdapterSchedule.model_validate({"processes": 2}).options().processes == 2
    with pytest.raises(ValidationError):
        AdapterSchedule.model_validate({"processes": 0})
