"""The policy artefact: one small, checksummed JSON document per policy version.

The registry stores it, `GET /v1/policy` serves it, the editor caches it. It carries everything
a policy needs to decide (its feature space, normaliser, weights and exploration floor), so a
policy keeps reading features as it was trained to, whatever the code's defaults are now.

The format `tabloop.policy/1`: the body's keys are sorted and its checksum is the SHA-256 of
the canonical body (compact, sorted, no NaN); `model.state` holds the weights by their torch
state names (`linear.weight`, ...) as nested lists.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from completion.gate.features import FeatureSpace, NumericFeature
from completion.gate.policy import CanaryPolicy, Normaliser, Policy, PolicyError, ShowWeights

ARTIFACT_FORMAT = "tabloop.policy/1"
TRANSFORMS = ("identity", "log1p")


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _space_to_json(space: FeatureSpace) -> dict[str, Any]:
    return {
        "numeric": [
            {"name": f.name, "lo": f.lo, "hi": f.hi, "transform": f.transform}
            for f in space.numeric
        ],
        "categorical": {key: list(values) for key, values in space.categorical},
    }


def _space_from_json(data: Mapping[str, Any]) -> FeatureSpace:
    numeric = tuple(
        NumericFeature(str(f["name"]), float(f["lo"]), float(f["hi"]), f["transform"])
        for f in data["numeric"]
    )
    for spec in numeric:
        if spec.transform not in TRANSFORMS:
            raise PolicyError(f"unknown transform {spec.transform!r}")
    categorical = tuple(
        (str(key), tuple(str(v) for v in values)) for key, values in data["categorical"].items()
    )
    return FeatureSpace(numeric, categorical)


def _body(policy: Policy) -> dict[str, Any]:
    body: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "version": policy.version,
        "show_floor": policy.show_floor,
        "features": _space_to_json(policy.space),
        "normaliser": {
            "mean": list(policy.normaliser.mean),
            "scale": list(policy.normaliser.scale),
        },
        "model": {
            "hidden": policy.weights.hidden,
            "state": {name: array.tolist() for name, array in policy.weights.state().items()},
        },
        "metadata": policy.metadata,
    }
    if isinstance(policy, CanaryPolicy):
        assert policy.previous is not None
        # Inside the checksummed body: the previous version travels with the candidate. A
        # client that does not know canaries reads the candidate alone.
        body["metadata"] = {
            **policy.metadata,
            "canary": {"share": policy.share, "previous": _body(policy.previous)},
        }
    return body


def to_artifact(policy: Policy) -> bytes:
    """The policy as a small, checksummed JSON document (a canary carries its previous
    version and share in its metadata)."""
    body = _body(policy)
    checksum = "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()
    return json.dumps({**body, "checksum": checksum}, sort_keys=True).encode()


def from_artifact(data: bytes) -> Policy:
    """Load an artefact, verifying its format, checksum and shapes; raises `PolicyError`."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != ARTIFACT_FORMAT:
            raise PolicyError("not a tabloop policy artefact")
        checksum = doc.pop("checksum", None)
        expected = "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()
        if checksum != expected:
            raise PolicyError("policy checksum does not match its content")
        return _policy_of(doc)
    except PolicyError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(f"malformed policy artefact: {exc}") from exc


def _policy_of(doc: dict[str, Any]) -> Policy:
    """The policy of a verified artefact body (raises like `from_artifact`)."""
    if doc.get("format") != ARTIFACT_FORMAT:
        raise PolicyError("not a tabloop policy artefact")
    space = _space_from_json(doc["features"])
    normaliser = Normaliser(
        tuple(float(v) for v in doc["normaliser"]["mean"]),
        tuple(float(v) for v in doc["normaliser"]["scale"]),
    )
    if len(normaliser.mean) != space.dim or len(normaliser.scale) != space.dim:
        raise PolicyError("normaliser does not match the feature space")
    if any(s <= 0 for s in normaliser.scale):
        raise PolicyError("normaliser has a non-positive scale")
    weights = ShowWeights.from_state(
        doc["model"]["state"], dim=space.dim, hidden=int(doc["model"]["hidden"])
    )
    metadata = dict(doc.get("metadata") or {})
    canary = metadata.pop("canary", None)
    if canary is not None:
        return CanaryPolicy(
            version=str(doc["version"]),
            space=space,
            normaliser=normaliser,
            weights=weights,
            show_floor=float(doc["show_floor"]),
            metadata=metadata,
            previous=_policy_of(dict(canary["previous"])),
            share=float(canary["share"]),
        )
    return Policy(
        version=str(doc["version"]),
        space=space,
        normaliser=normaliser,
        weights=weights,
        show_floor=float(doc["show_floor"]),
        metadata=metadata,
    )
