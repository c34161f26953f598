"""The trainer's torch model and the editor's numpy forward pass are the same function."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from backend.policy.reward_model import RewardModel
from backend.policy.settings import TrainerSettings
from backend.policy.show_model import ShowModel, show_probability
from backend.policy.trainer import fit_candidate
from completion.gate import builtin_policy, from_artifact, to_artifact
from tests.backend.policy.synthetic import Logger, contexts


@pytest.fixture(scope="module")
def logged():
    return Logger(builtin_policy(), seed=4).log(contexts(600, seed=3))


@pytest.mark.parametrize("hidden", [pytest.param(0, id="logistic"), pytest.param(8, id="mlp")])
def test_a_trained_artifact_gives_the_same_probabilities_in_numpy_and_torch(
    logged, hidden: int
) -> None:
    settings = TrainerSettings(hidden=hidden, steps=60)
    serving = builtin_policy()
    trained = fit_candidate(serving, logged, RewardModel.zero(serving.space), settings, "v2")
    artifact = to_artifact(trained)

    served = from_artifact(artifact)
    rows = contexts(400, seed=21)
    numpy_p = served.p_show_batch(rows)

    # The torch side reads the same document on its own: strict state load, torch forward pass.
    doc = json.loads(artifact)
    model = ShowModel(served.space.dim, int(doc["model"]["hidden"]))
    state = {k: torch.tensor(v, dtype=torch.float64) for k, v in doc["model"]["state"].items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    active = [f for f in rows if float(f["suggestion_chars"]) > 0]
    x = torch.as_tensor(served.inputs(active), dtype=torch.float64)
    with torch.inference_mode():
        torch_p = show_probability(model, x, float(doc["show_floor"])).numpy()

    non_empty = numpy_p > 0
    assert non_empty.sum() == len(active) > 300
    np.testing.assert_allclose(numpy_p[non_empty], torch_p, rtol=0, atol=1e-6)
    # Training moved the weights (a comparison of the untrained builtin would prove little).
    assert np.max(np.abs(numpy_p - serving.p_show_batch(rows))) > 1e-3
    if hidden:
        assert trained.weights.mlp_out_weight is not None
        assert np.any(trained.weights.mlp_out_weight != 0)


def test_weights_round_trip_through_the_torch_model_exactly() -> None:
    torch.manual_seed(0)
    model = ShowModel(builtin_policy().space.dim, hidden=4)
    weights = model.to_weights()
    again = ShowModel.from_weights(weights)
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
        np.testing.assert_array_equal(weights.state()[name], tensor.numpy())
