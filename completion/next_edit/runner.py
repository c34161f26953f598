"""The runner of next-edit rewrites: the completion model's own, or torch in bfloat16 beside it.

A rewrite reads a long prompt (recent edits, the window before and now) and then checks the
current window as its draft, many tokens per forward pass. Both are matrix products over many
tokens at once, which a CPU that multiplies bfloat16 natively computes faster in bfloat16 than
the 8-bit fast engines do: the drafted rewrites of `tabloop bench speculative-edits` ran
2.3-2.6x as fast at p50 as on ONNX Runtime GenAI on a 2-core Xeon with AMX, and 1.2-1.4x as
fast on a 2-core AMD EPYC with AVX-512 BF16 and no AMX, where an adapted model's rewrites on a
replayed history took 2.3 s against 3.9 s. Decoding one token at a time, the fast engines stay
ahead (they read half the bytes per token), so inline completions keep their engine and next
edits get a second runner of the same model and adapter (`nextEdit.engine`, docs/next-edit.md).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from common.machine import native_bfloat16

if TYPE_CHECKING:
    from completion.next_edit.settings import NextEditSettings
    from completion.runners.base import ModelRunner
    from completion.runners.torch_runner import TorchRunner
    from completion.settings import CompletionSettings

NextEditEngine = Literal["completion", "torch-bfloat16"]


def next_edit_engine(
    next_edit: NextEditSettings,
    completion: CompletionSettings,
    flags: Collection[str] | None = None,
) -> NextEditEngine:
    """What `nextEdit.engine` resolves to on a CPU with `flags` (None: this CPU, as
    `common.machine.native_bfloat16` sees it, `$TABLOOP_NATIVE_BFLOAT16` included)."""
    if next_edit.engine != "auto":
        return next_edit.engine
    if completion.runner != "local" or completion.engine == "torch":
        return "completion"  # a server's model, or torch already
    native = _native_here() if flags is None else native_bfloat16(flags)
    return "torch-bfloat16" if native else "completion"


@functools.cache
def _native_here() -> bool:
    """Whether this CPU multiplies bfloat16 natively, read once: the server asks at every
    request, on its event loop."""
    return native_bfloat16()


def load_next_edit_runner(
    completion: CompletionSettings, cache_dir: Path, *, pack_weights: bool = True
) -> TorchRunner:
    """A torch bfloat16 runner of the completion model with its adapter, on every core unless
    `completion.threads` says otherwise (it runs on the model thread, never beside the
    completion runner), its linear layers' weights packed for oneDNN unless `pack_weights` is
    False (`completion.runners.packed`). Seconds; call it off the event loop."""
    import os

    from completion.runners.torch_runner import TorchRunner

    family = None if completion.fim_template == "auto" else completion.fim_template
    return TorchRunner(
        completion.model,
        cache_dir,
        dtype="bfloat16",
        threads=completion.threads or os.cpu_count() or 1,
        reuse_cache=completion.cache,
        family=family,
        adapter=Path(completion.adapter).expanduser() if completion.adapter else None,
        pack_weights=pack_weights,
    )


def follow_adapter(runner: TorchRunner, serving: ModelRunner) -> None:
    """Serve on `runner` the adapter `serving` (the completion runner) serves, when they differ:
    a new adapter version reaches next edits with the first prediction after it. A runner that
    serves no adapters (an HTTP server's model) leaves `runner` as it is."""
    from completion.runners.base import RunnerCapabilities

    adapters = RunnerCapabilities.of(serving).adapters
    if adapters is not None and adapters.adapter != runner.adapter:
        runner.swap_adapter(adapters.adapter)
