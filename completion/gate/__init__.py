"""The gate policy: whether to show a suggestion or stay silent.

Serving needs only numpy; the trainer's torch model lives in `backend.policy.show_model`.

- `features`: `Signals`, `extract_features` and the `FeatureSpace` that turns the raw values into
  a vector, shared by serving and training so a feature means the same thing on both sides.
- `policy`: the `Normaliser`, the logit's `ShowWeights` (logistic plus optional MLP, in numpy),
  the `Policy` that draws an action with its propensity, the `CanaryPolicy` mixture of a new
  version with the previous one, and the built-in policy.
- `artifact`: the versioned, checksummed JSON document a policy travels in.

The names most callers need are importable from here (`from completion import gate`).
"""

from __future__ import annotations

from completion.gate.artifact import ARTIFACT_FORMAT, from_artifact, to_artifact
from completion.gate.features import (
    LANGUAGES,
    OTHER,
    Features,
    FeatureSpace,
    FeatureValue,
    NumericFeature,
    Signals,
    extract_features,
    is_empty,
)
from completion.gate.policy import (
    BUILTIN_VERSION,
    DEFAULT_SHOW_FLOOR,
    CanaryPolicy,
    Normaliser,
    Policy,
    PolicyError,
    ShowWeights,
    builtin_policy,
)

__all__ = [
    "ARTIFACT_FORMAT",
    "BUILTIN_VERSION",
    "DEFAULT_SHOW_FLOOR",
    "LANGUAGES",
    "OTHER",
    "CanaryPolicy",
    "FeatureSpace",
    "FeatureValue",
    "Features",
    "Normaliser",
    "NumericFeature",
    "Policy",
    "PolicyError",
    "ShowWeights",
    "Signals",
    "builtin_policy",
    "extract_features",
    "from_artifact",
    "is_empty",
    "to_artifact",
]
