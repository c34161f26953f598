"""Settings of the training loop: the `training` section of tabloop's configuration.

The language server trains the workspace's next adapter by itself (`training.background`,
`lsp_server.features.training_loop`); these say when a run starts, how it yields and what it
may use. The README's configuration table and the VS Code settings are generated from them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from training.budget import parse_duration


class TrainingLoopSettings(BaseModel):
    """When the server trains the next adapter version on its own, and within what limits."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    auto: bool = Field(
        True,
        description="Train the workspace's next adapter version in the background when there is "
        "enough new material and the machine is idle, and promote it if it is judged better. "
        "Off by itself when the configured model cannot be trained here (the `http` runner, a "
        "named `completion.adapter`, `completion.adapterSource` `backend`, no `peft`); "
        "`tabloop/status` says why.",
    )
    min_new_feedback: int = Field(
        200,
        ge=1,
        description="New feedback rows (shown suggestions with their outcome) since the serving "
        "version's mark and since the last run that make a run due.",
    )
    min_new_edit_examples: int = Field(
        100,
        ge=1,
        description="New next-edit examples (kept at pauses in the user's editing, "
        "`nextEdit.learnSettleS`) since the last run that read them that make a run due.",
    )
    min_new_commits: int = Field(
        20,
        ge=1,
        description="New commits touching source files in the workspace's git history since the "
        "last next-edit run (all of them before the first) that make a next-edit run due, where "
        "next edits train apart (`nextEdit.engine` `torch-bfloat16`).",
    )
    min_changed_files: int = Field(
        20,
        ge=1,
        description="Workspace code files changed since the last run (all of them before the "
        "first) that make a run due.",
    )
    min_interval_s: float = Field(
        3_600.0,
        ge=0.0,
        description="Seconds from the start of one run to the start of the next (an unfinished "
        "run resumes sooner, unless it was stopped for memory).",
    )
    idle_s: float = Field(
        120.0,
        ge=0.0,
        description="A run starts only when no completion was asked for in this many seconds "
        "(nor the server started).",
    )
    max_load: float = Field(
        0.5,
        ge=0.0,
        description="A run starts only when the 1-minute load average per CPU core is below this.",
    )
    pause_after_ms: int = Field(
        2000,
        ge=0,
        description="The training process is paused (SIGSTOP) while a completion request is "
        "served and until this many milliseconds after the last one, then continued.",
    )
    check_every_s: float = Field(
        60.0, gt=0.0, description="Seconds between looks at whether a run is due."
    )
    budget: str = Field(
        "20m",
        description="Wall-clock budget of one run (`20m`, `1h`, `90s`); time spent paused "
        "counts, and a run stopped and resumed goes on where its budget stood.",
    )
    budget_samples: int = Field(
        0, ge=0, description="A budget in training examples too (the first reached ends a run)."
    )
    threads: int = Field(
        1, ge=1, description="CPU threads of the training process (OMP_NUM_THREADS, torch)."
    )
    max_memory_mb: int = Field(
        12_288,
        ge=0,
        description="The training process is stopped when its resident memory passes this "
        "(it resumes from its checkpoint later); 0 sets no cap.",
    )
    checkpoint_every: int = Field(
        10, ge=1, description="Optimiser steps between checkpoints (what a stopped run keeps)."
    )
    eval_cursors: int = Field(
        50,
        ge=0,
        description="Held-out cursors a new version is judged on against the serving one; 0 "
        "judges none, and nothing is promoted.",
    )

    @field_validator("budget")
    @classmethod
    def _a_duration(cls, value: str) -> str:
        parse_duration(value)
        return value
