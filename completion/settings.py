"""Settings of the completion engine: the `completion` section of tabloop's configuration.

Every field has a default and a description; the README's configuration table and the VS Code
extension's `contributes.configuration` are generated from these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

SECTION_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CompletionSettings(BaseModel):
    """How suggestions are produced."""

    model_config = SECTION_CONFIG

    enabled: bool = Field(True, description="Offer inline suggestions at all.")
    model: str = Field(
        "bundled",
        description=(
            "`bundled` (Qwen2.5-Coder-0.5B from the `tabloop[models]` packages), "
            "a Hugging Face model id, or a local path (directory or `.gguf` file)."
        ),
    )
    runner: Literal["local", "http"] = Field(
        "local",
        description="`local` runs the model in-process; `http` calls an OpenAI-compatible "
        "`/v1/completions` server.",
    )
    http_url: str = Field(
        "http://127.0.0.1:8765/v1",
        description="Base URL of the OpenAI-compatible server used when `runner` is `http`.",
    )
    http_model: str = Field("", description="Model name sent to the HTTP server (`model`).")
    http_adapter: str = Field(
        "",
        description="LoRA adapter name on the HTTP server (vLLM's `--lora-modules` or "
        "`/v1/load_lora_adapter`), sent as `model` instead of `httpModel`; the base model "
        "serves while the server does not know it. Empty: none (tabloop's backend picks the "
        "tenant's adapter itself).",
    )
    http_api_key: str = Field("", description="Bearer token for the HTTP server; empty sends none.")
    http_timeout_s: float = Field(
        10.0, gt=0, description="Overall time limit of one HTTP completion call, in seconds."
    )
    fim_template: Literal["auto", "qwen", "starcoder", "codellama", "deepseek"] = Field(
        "auto", description="Fill-in-the-middle prompt format; `auto` infers it from the model."
    )
    engine: Literal["auto", "onnxruntime", "ctranslate2", "torch"] = Field(
        "auto",
        description="Inference engine of the local runner. `auto` is ONNX Runtime GenAI (8-bit "
        "weights, its KV cache kept across keystrokes, built once at first use: on a 2-core CPU "
        "it decodes 2.3x faster than CTranslate2 int8 and reads prompts 2.5x slower, 3.9x "
        "torch float32's speed over a whole request; `tabloop bench engines`, "
        "`tabloop bench complete`, docs/models.md); CTranslate2 (int8) when it cannot be used "
        "or float weights are asked "
        "for, and torch when neither can; `torch` is the reference output, and what adapter "
        "training and speculative decoding use.",
    )
    dtype: Literal["auto", "bfloat16", "float32", "int8", "int4"] = Field(
        "auto",
        description="Weights of the local runner on the CPU. `auto` is `int8` in the fast engines "
        "and `float32` in torch, chosen by `tabloop bench engines` and `tabloop eval holes "
        "--engines` on a 2-core CPU (docs/models.md); `int4` (ONNX Runtime GenAI only) decodes "
        "faster but wrote worse code on the holes measured.",
    )
    threads: int = Field(
        0,
        ge=0,
        description="Threads of the local runner; 0 uses every core in the fast engines (ONNX "
        "Runtime GenAI, CTranslate2) and every core but one in torch.",
    )
    max_new_tokens: int = Field(
        64, ge=1, le=1024, description="Most tokens generated for one suggestion."
    )
    typing_max_lines: int = Field(
        1,
        ge=1,
        le=16,
        description="Most lines of a suggestion asked for while typing (automatic trigger); an "
        "explicit request gets a block of up to 16. One line at a time arrives in about a "
        "fifth of the time of a 64-token block on a 2-core CPU, and the prefetch computes "
        "the next line while the user reads this one (docs/models.md).",
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 decodes greedily.")
    context_tokens: int = Field(
        512,
        ge=64,
        le=32768,
        description="Token budget of the whole prompt. 512 reads the prompt in less than half "
        "the time of 1,024 with the same quality on `tabloop eval holes` (docs/models.md).",
    )
    prefix_share: float = Field(0.8, gt=0, le=1, description="Share of the budget for the prefix.")
    suffix_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Share of the budget for the suffix (shares are relative: with the prefix's "
        "0.8 it gets 1/9, about 56 tokens of 512). The suffix is read again at every keystroke; "
        "0.1 reads it in half the time of 0.2 with the same quality on `tabloop eval holes` "
        "(docs/models.md).",
    )
    snippet_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the budget that snippets from other files may take from the "
        "prefix. Snippets always get what the prefix leaves (it starts on an anchor line); 0 "
        "keeps the prefix whole, which lost least on `tabloop eval holes` (docs/models.md).",
    )
    snippet_min_similarity: float = Field(
        0.0,
        ge=-1.0,
        le=1.0,
        description="Least similarity (cosine, -1 to 1) of a snippet found by meaning to be put "
        "in the prompt; definitions of names near the cursor are kept whatever their score.",
    )
    snippet_definition_heads: bool = Field(
        False,
        description="Cut a definition of a name used near the cursor that is too long for the "
        "snippets' share to its first lines (its signature) instead of leaving it out (off: no "
        "gain measured, docs/models.md).",
    )
    context_timeout_ms: int = Field(
        50, ge=0, description="Time limit for gathering context; late snippets are left out."
    )
    min_chars: int = Field(
        2, ge=1, description="Shortest suggestion worth showing, in non-blank characters."
    )
    prompt_at_line_break: bool = Field(
        True,
        description="When the cursor stands after indentation only, end the prompt at the line "
        "break and let the model write the indentation (off only to measure).",
    )
    token_healing: bool = Field(
        True,
        description="When the cursor stands inside a word or operator (`if isinst`), end the "
        "prompt before it and make the model write it again, so its first token may complete it "
        "(local engines; off only to measure).",
    )
    syntax_check: bool = Field(
        True,
        description="Parse the file with the suggestion in place (tree-sitter) and cut a "
        "suggestion that breaks code which parsed there to its longest part that does not, or "
        "drop it.",
    )
    cache: bool = Field(
        True,
        description="Reuse the model state of the prompt's unchanged start across keystrokes, "
        "and typed-through suggestions (off only to measure).",
    )
    candidates: int = Field(
        3,
        ge=1,
        le=10,
        description="Suggestions offered when the user asks explicitly (cycle them with "
        "Alt+] / Alt+[); typing gets one.",
    )
    prefetch: bool = Field(
        True,
        description="After showing a suggestion, compute the next one as if it were accepted, "
        "so that the request after Tab is answered at once; dropped at any other edit.",
    )
    latency_skip: bool = Field(
        True,
        description="Answer empty when the suggestion would arrive after the user's likely next "
        "keystroke (predicted from this engine's speed and the typing rhythm).",
    )
    latency_wait_ms: int = Field(
        2000,
        ge=0,
        le=10_000,
        description="How long a request whose suggestion would come too late waits for the "
        "user's pause to turn out longer (the longer they stay idle, the longer they probably "
        "will) before it is answered empty; the next keystroke ends the wait. 0 answers at once.",
    )
    speculative: bool = Field(
        False,
        description="Torch engine, greedy decoding: draft tokens from repeats in the prompt and "
        "check them in one forward pass (same output; docs/models.md has when it pays).",
    )
    speculative_tokens: int = Field(
        8, ge=1, le=16, description="Most drafted tokens checked per forward pass."
    )
    adapter: str = Field(
        "",
        description="LoRA adapter directory served on the local model (`tabloop train model` "
        "writes them; the fast engine merges and converts it once, at load); empty serves the "
        "promoted adapter `adapterSource` names.",
    )
    adapter_source: Literal["auto", "backend", "workspace"] = Field(
        "auto",
        description="Where the served adapter comes from: `backend`, the tenant's serving adapter "
        "(`GET /v1/model` of `backend.url`, fetched and checked); `workspace`, the "
        "workspace's promoted one (`tabloop model promote`); `auto`, the backend's when it "
        "serves one, else the workspace's.",
    )
    feedback_rows: int = Field(
        20_000,
        ge=0,
        description="Shown suggestions kept with their outcome and context in the cache directory "
        "(never sent) for `tabloop train model`; the oldest go first; 0 keeps none.",
    )
