"""Settings of next-edit prediction: the `nextEdit` section of tabloop's configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from completion.settings import SECTION_CONFIG

SCREEN_BELOW = 0.4
"""The screen's default threshold (`tabloop train edit-screen` reports what it answers there)."""


class NextEditSettings(BaseModel):
    """How next edits are predicted (`docs/next-edit.md`)."""

    model_config = SECTION_CONFIG

    enabled: bool = Field(
        True,
        description="Predict the next edit near the cursor from the recent edits "
        "(`textDocument/copilotInlineEdit`, `tabloop/nextEdit`).",
    )
    window_lines: int = Field(
        10,
        ge=1,
        le=50,
        description="Lines above and below the cursor's line that the model may rewrite.",
    )
    window_tokens: int = Field(
        256,
        ge=16,
        le=2048,
        description="Most tokens of the rewritten window: lines farthest from the cursor are "
        "left out until it fits, and a line longer than this ends the window. The model writes "
        "at most this many tokens plus `marginTokens`.",
    )
    margin_tokens: int = Field(
        32,
        ge=0,
        le=512,
        description="Tokens the rewrite may write beyond the window's own.",
    )
    history_events: int = Field(
        3, ge=0, le=6, description="Recent edits shown to the model, the latest last."
    )
    history_tokens: int = Field(
        512,
        ge=0,
        le=4096,
        description="Token budget of the recent edits in the prompt; the oldest go first.",
    )
    recent_s: float = Field(
        60.0,
        gt=0,
        description="How long after the latest edit in a document a prediction is still asked "
        "of the model there; later (or with no edit near the cursor) the answer is no change, "
        "at once.",
    )
    screen_below: float = Field(
        SCREEN_BELOW,
        ge=0,
        le=1,
        description="Ask the model only when the screen (`docs/next-edit.md`) puts the chance "
        "that the next edit lies inside the window at this or more; below it the answer is no "
        "change, without the model. 0 asks the model every time.",
    )
    screen_weights: str = Field(
        "",
        description="A screen written by `tabloop train edit-screen --out FILE` to use instead "
        "of the bundled one.",
    )
    engine: Literal["auto", "completion", "torch-bfloat16"] = Field(
        "auto",
        description="What runs next-edit rewrites. `completion`: the completion model's runner. "
        "`torch-bfloat16`: a second runner of the same model and adapter, torch in bfloat16 "
        "on every core (about 1.8 GB more memory), which reads a rewrite's prompt and checks "
        "its draft faster where the CPU multiplies bfloat16 natively (2.3-2.6x with AMX, "
        "1.2-1.4x with AVX-512 BF16, on 2 cores). `auto` is `torch-bfloat16` where "
        "the CPU has AMX or AVX-512 BF16 and the completion runner is a local fast engine "
        "(ONNX Runtime GenAI, CTranslate2), else `completion` (docs/next-edit.md).",
    )
    prefetch: bool = Field(
        True,
        description="After showing a predicted edit, compute the prediction that accepting it "
        "leads to while the user reads it, so that the next edit after Tab comes without "
        "waiting for the model; dropped at any other edit or a dismissal, and stopped before "
        "Tab by an inline completion request that needs the model (after Tab, that request "
        "waits for it).",
    )
    preread: bool = Field(
        True,
        description="Read the recent edits that will start the next prediction's prompt while "
        "the user is between edits (a pause, or the first change of a new edit), where the "
        "runner keeps prompts (torch), so that the prediction computes only the rest; stopped "
        "by an inline completion request that needs the model.",
    )
    learn_settle_s: float = Field(
        20.0,
        ge=0,
        description="Learn next edits from the user's own editing: at each pause in a document "
        "the server notes what a prediction would see, and this many seconds later the text the "
        "user settled on, as a training example for the workspace's adapter (kept in the cache "
        "directory, never sent). 0 keeps none.",
    )
