"""The builder of the tiny Qwen2-architecture code model the tests run on.

The bundled 0.5B model takes too long to load for a fast suite, so tests use this: a byte-level
BPE tokenizer with Qwen's FIM special tokens, and a two-layer Qwen2 causal LM trained for a few
hundred steps (fixed seed) on fill-in-the-middle examples cut from real standard-library code.
It is not a good model, but it is a real one: the runner's loading, tokenising, prefill, decode,
cancellation and KV reuse all run on it.

Training gives different weights on different CPUs, so the model is built once and committed
(`tests/fixtures/tiny-model-v<BUILDER_VERSION>/`, see `tests.support.fixtures`); no test trains
it. Bump `BUILDER_VERSION` when the recipe changes. Two processes that build into the same target
both build in private temporary directories and the first rename wins.
"""

from __future__ import annotations

import os
import random
import shutil
import sysconfig
import tempfile
from pathlib import Path

BUILDER_VERSION = 1

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
# Real, stable standard-library modules with plenty of small functions.
SOURCE_MODULES = (
    "textwrap.py",
    "shlex.py",
    "fnmatch.py",
    "colorsys.py",
    "bisect.py",
    "heapq.py",
    "glob.py",
    "posixpath.py",
    "genericpath.py",
    "string.py",
    "keyword.py",
    "copy.py",
    "operator.py",
    "stat.py",
)
VOCAB_SIZE = 1024
SEQ_LEN = 80
STEPS = 120
BATCH = 8
SEED = 1234


def _source_texts() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in SOURCE_MODULES]


def _fim_examples(texts: list[str], rng: random.Random, count: int) -> list[str]:
    """FIM documents: a window of code with a one-to-three-line middle cut out."""
    examples: list[str] = []
    windows: list[list[str]] = []
    for text in texts:
        lines = text.splitlines(keepends=True)
        windows.extend(lines[i : i + 12] for i in range(0, max(len(lines) - 12, 1), 3))
    # Bodies of functions matter most for the tests: prefer windows with a `def`.
    with_def = [w for w in windows if any(line.lstrip().startswith("def ") for line in w)]
    while len(examples) < count:
        window = rng.choice(with_def if rng.random() < 0.7 else windows)
        start = rng.randrange(1, len(window) - 1) if len(window) > 2 else 0
        end = min(start + rng.randint(1, 3), len(window))
        prefix, middle, suffix = (
            "".join(window[:start]),
            "".join(window[start:end]),
            "".join(window[end:]),
        )
        if not middle.strip():
            continue
        examples.append(
            f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{middle}<|endoftext|>"
        )
    return examples


def _train_tokenizer(texts: list[str], target: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.save_pretrained(target)
    return fast


def _train_model(tokenizer: object, examples: list[str], target: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    vocab: dict[str, int] = tokenizer.get_vocab()  # type: ignore[attr-defined]
    eos = vocab["<|endoftext|>"]
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    model = Qwen2ForCausalLM(config)
    encoded = [
        tokenizer(text)["input_ids"][-SEQ_LEN:]  # type: ignore[operator]
        for text in examples
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    rng = random.Random(SEED)
    for _ in range(STEPS):
        batch = rng.sample(encoded, BATCH)
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((BATCH, width), eos, dtype=torch.long)
        labels = torch.full((BATCH, width), -100, dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(ids)] = torch.tensor(ids)
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.generation_config.eos_token_id = eos
    model.save_pretrained(target)


def build_tiny_model(target: Path) -> Path:
    """The tiny model's directory, built (once) at `target`."""
    if (target / "config.json").is_file():
        return target
    import torch

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread: reproducible float sums on every machine
        rng = random.Random(SEED)
        texts = _source_texts()
        tokenizer = _train_tokenizer(texts, work)
        _train_model(tokenizer, _fim_examples(texts, rng, 1200), work)
        try:
            os.rename(work, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # Another process finished first; its model is as good as ours.
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(work, ignore_errors=True)
    return target


NEAR_TIE = 1e-3
"""Top-2 logit gaps above this cannot be flipped by another CPU's rounding (see greedy_margin)."""


def greedy_margin(model_dir: Path, prompt: str, new_tokens: int) -> float:
    """The smallest gap between the two highest logits along the greedy path from `prompt`.

    Tests that compare two ways of computing the same greedy text (with and without the KV
    cache, chunked or whole prefill) hold on every CPU only if no step is a near-tie: CPUs differ
    in the last bits of each logit (about 1e-5 here), so a gap far above that cannot flip.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    margin = float("inf")
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(input_ids=ids).logits[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return margin
