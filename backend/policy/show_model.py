"""The policy's logit as a torch module: the differentiable twin of the serving `ShowWeights`.

Only training needs gradients, so torch stays here and the editor serves with numpy. Both sides
name and shape the parameters alike (the artefact's `model.state`), and a test holds the two
forward passes to the same probabilities.
"""

from __future__ import annotations

import torch
from torch import nn

from completion.gate import ShowWeights


class ShowModel(nn.Module):
    """Logit of showing: a logistic part plus an optional small tanh MLP (zero at the start)."""

    def __init__(self, dim: int, hidden: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.hidden = hidden
        # float64 throughout: the model is tiny, and a propensity such as 1 - P(show) near 0 must
        # come out the same in training as the serving side's float64 numpy computes it.
        self.linear = nn.Linear(dim, 1, dtype=torch.float64)
        self.mlp_in: nn.Linear | None = None
        self.mlp_out: nn.Linear | None = None
        if hidden:
            self.mlp_in = nn.Linear(dim, hidden, dtype=torch.float64)
            self.mlp_out = nn.Linear(hidden, 1, dtype=torch.float64)
            # Zero output: a new MLP starts as the logistic model it extends.
            nn.init.zeros_(self.mlp_out.weight)
            nn.init.zeros_(self.mlp_out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = self.linear(x).squeeze(-1)
        if self.mlp_in is not None and self.mlp_out is not None:
            logit = logit + self.mlp_out(torch.tanh(self.mlp_in(x))).squeeze(-1)
        return logit

    @classmethod
    def from_weights(cls, weights: ShowWeights) -> ShowModel:
        """A trainable model that starts as exactly the serving weights."""
        model = cls(weights.dim, weights.hidden)
        state = {name: torch.tensor(array) for name, array in weights.state().items()}
        model.load_state_dict(state, strict=True)
        return model

    def to_weights(self) -> ShowWeights:
        """The current parameters as serving weights (a copy)."""
        state = {name: tensor.detach().cpu().numpy() for name, tensor in self.state_dict().items()}
        return ShowWeights.from_state(state, dim=self.dim, hidden=self.hidden)


def show_probability(model: ShowModel, x: torch.Tensor, show_floor: float) -> torch.Tensor:
    """P(show) with the exploration floor, differentiable: what the trainer climbs."""
    return show_floor + (1.0 - show_floor) * torch.sigmoid(model(x))
