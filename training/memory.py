"""How many examples a training step can hold at once: the memory one example needs, the memory
free for it, the micro-batch that follows (`training.trainer`), and activation checkpointing,
which trades a recomputation for most of it."""

from __future__ import annotations

from typing import Any


def available_memory_bytes(device: str) -> int:
    """Memory free for training on `device` (CUDA: free device memory; CPU: MemAvailable)."""
    import torch

    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2 << 30


def bytes_per_example(
    config: Any,
    sequence_tokens: int,
    kept_positions: int,
    *,
    element_bytes: int = 4,
    checkpointing: bool = False,
    kl: bool = False,
    checkpointing_every: int = 1,
) -> int:
    """A generous estimate of the memory one example needs in a training step: the activations
    kept for the backward pass (`element_bytes` each: 4 in float32, about 3 when most are
    bfloat16 and the LoRA path's are float32; with activation checkpointing only each decoder
    layer's input is kept, and one layer's activations are recomputed at a time) and the
    float32 logits, log-softmax and gradient at the `kept_positions` (twice as many with the
    reference's for a KL anchor)."""
    hidden = int(getattr(config, "hidden_size", 1024))
    layers = int(getattr(config, "num_hidden_layers", 24))
    inner = int(getattr(config, "intermediate_size", 4 * hidden))
    heads = int(getattr(config, "num_attention_heads", 16))
    vocab = int(getattr(config, "vocab_size", 32000))
    # Saved activations per token and layer, fitted to a measurement: Qwen2.5-Coder-0.5B at 456
    # tokens held about 3 GB per example in float32 on a CPU.
    per_token_layer = (24 * hidden + 6 * inner) * element_bytes
    attention = heads * sequence_tokens * sequence_tokens * element_bytes * 2
    layer = sequence_tokens * per_token_layer + attention
    if checkpointing:
        # Every `checkpointing_every`-th layer keeps only its input; the others keep everything.
        kept = -(-layers // max(1, checkpointing_every))
        activations = kept * sequence_tokens * hidden * element_bytes + (layers - kept + 1) * layer
    else:
        activations = layers * layer
    logits = kept_positions * vocab * 4 * (6 if kl else 3)
    return activations + logits


def size_micro_batch(effective_batch: int, device: str, free_bytes: int, per_example: int) -> int:
    """One example per pass on a CPU; on a GPU `memory_micro_batch`.

    On a CPU a larger micro-batch buys nothing: the examples are padded to the longest, and the
    matrix products of one 450-token example already keep the cores busy; it only costs memory
    (an earlier `tabloop bench train` on the bundled model, 2 threads: one example a pass with the
    other defaults of then 0.144 samples/s at 5.2 GB peak, two 0.137 at 8.7 GB)."""
    if not device.startswith("cuda"):
        return 1
    return memory_micro_batch(effective_batch, free_bytes, per_example)


def memory_micro_batch(effective_batch: int, free_bytes: int, per_example: int) -> int:
    """The largest divisor of `effective_batch` whose activations fit in a third of the free
    memory (the machine keeps working beside the trainer): the rule on every device as the
    trainer was first built (`tabloop bench train`'s baseline keeps it)."""
    fits = max(1, (free_bytes // 3) // max(per_example, 1))
    return max(d for d in range(1, effective_batch + 1) if effective_batch % d == 0 and d <= fits)


def enable_checkpointing(model: Any, every: int = 1) -> None:
    """Activation checkpointing of every `every`-th decoder layer of a (peft-wrapped) causal LM
    (transformers' `every_n_layers`), non-reentrant (so the frozen embeddings need no
    `enable_input_require_grads`)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner.activation_checkpointing_enable({"use_reentrant": False}, every_n_layers=every)
