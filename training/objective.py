"""The training objective's tensors: the middle's token log-likelihoods and the KL anchor.

The model body runs over the whole left-padded batch, but the LM head (151,936 outputs on the
bundled model) runs only at the positions that predict a middle's token (`TokenBatch.rows`,
`columns`): no logits for the prompt, for padding, or for a short middle's slack beside a long
one. The KL anchor compares, at those same positions, the adapted model's next-token distribution
with a reference's: the base model (the LoRA layers disabled) or the adapter the run started from
(the warm start, or the base model when it started fresh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Reference = Literal["start", "base"]
REFERENCES: tuple[Reference, ...] = ("start", "base")


@dataclass
class TokenBatch:
    """A left-padded batch (every middle ends at the last position) and its target tokens."""

    ids: Any  # [batch, length] token ids
    mask: Any  # [batch, length] 1 where a token is, 0 for padding
    positions: Any  # [batch, length] position ids (0 at each row's first token)
    rows: Any  # [targets] the row of each middle token
    columns: Any  # [targets] the position whose output predicts it
    targets: Any  # [targets] the token
    counts: Any  # [batch] middle tokens per row
    weights: Any = None  # [targets] each middle token's weight in its row's mean (None: 1)

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])


def pack(
    sequences: Sequence[tuple[Sequence[int], int]],
    pad: int,
    weights: Sequence[Sequence[float] | None] | None = None,
) -> TokenBatch:
    """`(ids, prompt_len)` pairs (a prompt followed by its middle) as one left-padded batch;
    `weights`, where given, weigh each row's middle tokens (a row's None: all 1)."""
    import torch

    longest = max(len(ids) for ids, _ in sequences)
    ids = torch.full((len(sequences), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    rows, columns, targets, counts = [], [], [], []
    for row, (tokens, prompt_len) in enumerate(sequences):
        if not 0 < prompt_len < len(tokens):
            raise ValueError(f"a sequence needs a prompt and a middle ({prompt_len}/{len(tokens)})")
        start = longest - len(tokens)
        ids[row, start:] = torch.tensor(list(tokens))
        mask[row, start:] = 1
        for k in range(prompt_len, len(tokens)):
            rows.append(row)
            columns.append(start + k - 1)
            targets.append(tokens[k])
        counts.append(len(tokens) - prompt_len)
    token_weights = None
    if weights is not None and any(w is not None for w in weights):
        flat: list[float] = []
        for (tokens, prompt_len), row_weights in zip(sequences, weights, strict=True):
            middle = len(tokens) - prompt_len
            if row_weights is not None and len(row_weights) != middle:
                raise ValueError(f"{len(row_weights)} weights for a middle of {middle} tokens")
            flat.extend(row_weights if row_weights is not None else [1.0] * middle)
        token_weights = torch.tensor(flat, dtype=torch.float32)
    return TokenBatch(
        ids,
        mask,
        (mask.cumsum(1) - 1).clamp(min=0),
        torch.tensor(rows),
        torch.tensor(columns),
        torch.tensor(targets),
        torch.tensor(counts),
        token_weights,
    )


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body and the LM head of a causal LM (peft-wrapped or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, inner.base_model_prefix), inner.get_output_embeddings()


def middle_logits(model: Any, batch: TokenBatch, device: str) -> Any:
    """[targets, vocabulary] logits at the target positions only (the body's hidden states
    everywhere, the head where a middle token is predicted)."""
    body, head = _body_and_head(model)
    hidden = body(
        input_ids=batch.ids.to(device),
        attention_mask=batch.mask.to(device),
        position_ids=batch.positions.to(device),
        use_cache=False,
    ).last_hidden_state
    return head(hidden[batch.rows.to(device), batch.columns.to(device)])


def per_row_mean(values: Any, batch: TokenBatch, weights: Any = None) -> Any:
    """[batch] the mean of per-target `values` over each row's middle tokens, weighted by
    `weights` ([targets]) where given."""
    import torch

    rows = batch.rows.to(values.device)
    sums = torch.zeros(batch.size, dtype=values.dtype, device=values.device)
    if weights is None:
        sums = sums.index_add(0, rows, values)
        return sums / batch.counts.to(values.device).clamp(min=1)
    weights = weights.to(device=values.device, dtype=values.dtype)
    sums = sums.index_add(0, rows, values * weights)
    totals = torch.zeros_like(sums).index_add(0, rows, weights)
    return sums / totals.clamp(min=1e-6)


def token_logprobs(logits: Any, batch: TokenBatch, full: bool) -> tuple[Any, Any | None]:
    """(the log-likelihood of each target token, the [targets, vocabulary] log-softmax when
    `full`, else None: cross-entropy alone keeps less for the backward pass)."""
    import torch
    import torch.nn.functional as F

    targets = batch.targets.to(logits.device)
    if not full:
        return -F.cross_entropy(logits.float(), targets, reduction="none"), None
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), logprobs


def kl_to_reference(logprobs: Any, reference_logits: Any, batch: TokenBatch) -> Any:
    """[batch] KL(adapted ‖ reference) of the next-token distributions, averaged over each
    row's middle positions; `logprobs` is the adapted model's log-softmax there."""
    import torch
    import torch.nn.functional as F

    reference = torch.log_softmax(reference_logits.float(), dim=-1)
    per_token = F.kl_div(reference, logprobs, log_target=True, reduction="none").sum(-1)
    return per_row_mean(per_token, batch)


class ReferenceModel:
    """The reference the KL anchor compares with, evaluated without gradients and without
    dropout: the base model (the adapter disabled) or the LoRA weights the run started from."""

    def __init__(self, model: Any, reference: Reference) -> None:
        if reference not in REFERENCES:
            raise ValueError(f"unknown KL reference {reference!r}; one of {REFERENCES}")
        self.model = model
        self.reference = reference
        self._start = (
            {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            if reference == "start"
            else {}
        )

    def logits(self, batch: TokenBatch, device: str) -> Any:
        import torch

        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.reference == "base":
                    with self.model.disable_adapter():
                        return middle_logits(self.model, batch, device)
                params = dict(self.model.named_parameters())
                current = {name: params[name].detach().clone() for name in self._start}
                # Autocast keeps the low-precision copy of a weight that needs a gradient for
                # the rest of its region, keyed by the tensor, not its values: the weights swap
                # in place, so the copies are dropped on both sides of the swap. Else the
                # adapted pass that follows in the same region ran on the start weights' copies,
                # made without a gradient (the LoRA weights got none, and the model diverged).
                torch.clear_autocast_cache()
                for name, value in self._start.items():
                    params[name].copy_(value)
                try:
                    return middle_logits(self.model, batch, device)
                finally:
                    for name, value in current.items():
                        params[name].copy_(value)
                    torch.clear_autocast_cache()
        finally:
            self.model.train(training)
