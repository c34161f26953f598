"""The gate policy: propensities, features shared by serving and training, the artefact."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common import languages
from completion.gate import (
    LANGUAGES,
    FeatureSpace,
    Normaliser,
    Policy,
    PolicyError,
    ShowWeights,
    Signals,
    builtin_policy,
    extract_features,
    from_artifact,
    to_artifact,
)
from completion.types import CompletionRequest, Generation
from telemetry.events import DecisionEvent, parse_event
from telemetry.privacy import apply_level
from tests.backend.policy.synthetic import contexts

REQUEST = CompletionRequest(
    prefix="import os\n\ndef load(path):\n    with open(path) as f:\n        return f.",
    suffix=")\n\nprint(load('x'))\n",
    language="python",
    trigger="automatic",
)


def _trained_looking(hidden: int = 0) -> Policy:
    """A policy with non-trivial weights and normalisation, as training would leave it."""
    base = builtin_policy()
    features = contexts(300, seed=5)
    normaliser = Normaliser.fit(base.space.matrix(features))
    policy = base.derive("v7", normaliser=normaliser)
    if hidden:
        from backend.policy.trainer import _with_hidden

        policy = _with_hidden(policy, hidden, seed=3)
        state = dict(policy.weights.state())
        state["mlp_out.weight"] = np.random.default_rng(3).normal(0, 0.5, (1, hidden))
        weights = ShowWeights.from_state(state, dim=policy.space.dim, hidden=hidden)
        policy = policy.derive(policy.version, weights=weights)
    return policy


@pytest.mark.parametrize(
    ("text", "logprobs", "expect_empty"),
    [
        pytest.param("read()", [-0.1, -0.2], False, id="confident"),
        pytest.param("readlines()", [-3.0, -2.5], False, id="unsure"),
        pytest.param("", [], True, id="empty"),
    ],
)
def test_propensities_are_logged_correctly_and_sum_to_one(
    text: str, logprobs: list[float], expect_empty: bool
) -> None:
    policy = builtin_policy()
    features = extract_features(REQUEST, text, Generation(text, logprobs), Signals())
    p = policy.p_show(features)
    rng = random.Random(11)
    draws = [policy.decide(features, rng) for _ in range(4000)]
    if expect_empty:
        assert p == 0.0
        assert set(draws) == {("silence", 1.0)}
        return
    for action, propensity in draws:
        # The propensity is the probability of the action taken; the two actions' sum to one.
        assert propensity == pytest.approx(p if action == "show" else 1.0 - p, abs=1e-12)
    shown = sum(action == "show" for action, _ in draws) / len(draws)
    assert shown == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / len(draws)) + 1e-3)


def test_floor_keeps_exploring_what_the_policy_would_silence() -> None:
    policy = builtin_policy(show_floor=0.05)
    features = extract_features(REQUEST, "x" * 20, Generation("x", [-15.0] * 5), Signals())
    assert policy.intent_batch([features])[0] < 1e-6
    assert policy.p_show(features) == pytest.approx(0.05, abs=1e-6)
    assert policy.with_floor(0.2).p_show(features) == pytest.approx(0.2, abs=1e-6)


def test_features_are_identical_at_serving_and_training_time() -> None:
    """What the server decides on is what the trainer reads back from the logged event."""
    policy = _trained_looking()
    generation = Generation("readline()", [-0.3, -0.1, -0.9])
    signals = Signals(typing_speed_cps=4.5, seconds_since_last_accept=12.0, retrieval_found=True)
    served = extract_features(REQUEST, "readline()", generation, signals)
    event = DecisionEvent(
        decision_id="d1",
        session_id="s1",
        install_id="i1",
        language="python",
        trigger="automatic",
        policy_version=policy.version,
        model_id="tiny",
        action="show",
        propensity=policy.p_show(served),
        features=served,
    )
    recorded = apply_level(event, "metrics")
    assert isinstance(recorded, DecisionEvent)
    wire = json.loads(recorded.model_dump_json())
    trained = parse_event(wire)
    assert isinstance(trained, DecisionEvent)
    assert dict(trained.features) == served
    np.testing.assert_array_equal(
        policy.space.matrix([served]), policy.space.matrix([trained.features])
    )
    assert policy.p_show(trained.features) == policy.p_show(served) == trained.propensity


def test_features_carry_no_code_text() -> None:
    features = extract_features(REQUEST, "readline()", None, Signals())
    strings = {v for v in features.values() if isinstance(v, str)}
    assert strings == {"python"}


def test_features_describe_the_cursor_and_suggestion() -> None:
    features = extract_features(REQUEST, "readline()\nx", Generation("", [-1.0, -3.0]), Signals())
    assert features["logprob_mean"] == pytest.approx(-2.0)
    assert features["logprob_min"] == -3.0
    assert features["logprob_first"] == -1.0
    assert features["logprob_head_min"] == -3.0
    assert features["leading_whitespace"] == 0.0
    assert features["suggestion_lines"] == 2.0
    assert features["after_dot"] == 1.0
    assert features["closers_after_cursor"] == 1.0
    assert features["code_after_cursor"] == 0.0
    assert features["indent_depth"] == 2.0
    other = extract_features(
        CompletionRequest(prefix="", suffix="", language="COBOL"), "x", None, Signals()
    )
    assert other["language"] == "other"


def test_features_tell_an_indent_the_line_already_has() -> None:
    """A suggestion that starts with whitespace where the cursor sits after the indent."""
    indented = CompletionRequest(prefix="def f():\n    ", suffix="", language="python")
    head = Generation("", [-0.5, -2.0, -0.1, -4.0])
    features = extract_features(indented, "    return 1", head, Signals())
    assert features["leading_whitespace"] == 1.0
    assert features["extra_indent"] == 1.0
    assert features["logprob_head_min"] == -2.0
    assert features["logprob_min"] == -4.0
    mid_line = CompletionRequest(prefix="x =", suffix="", language="python")
    assert extract_features(mid_line, " 1", head, Signals())["extra_indent"] == 0.0


@pytest.mark.parametrize("hidden", [0, 8])
def test_artifact_round_trips_exactly(hidden: int) -> None:
    policy = _trained_looking(hidden)
    loaded = from_artifact(to_artifact(policy))
    features = contexts(50, seed=9)
    np.testing.assert_array_equal(loaded.p_show_batch(features), policy.p_show_batch(features))
    assert loaded.version == "v7"
    assert len(to_artifact(policy)) < 64_000


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda d: d.replace(b'"v7"', b'"v8"'), id="content-changed"),
        pytest.param(lambda d: d[: len(d) // 2], id="truncated"),
        pytest.param(lambda d: b"\x00garbage", id="garbage"),
        pytest.param(lambda d: json.dumps({"format": "other"}).encode(), id="wrong-format"),
    ],
)
def test_corrupt_artifacts_are_refused(tamper) -> None:
    with pytest.raises(PolicyError):
        from_artifact(tamper(to_artifact(_trained_looking())))


@pytest.mark.parametrize("hidden", [0, 8])
def test_renormalising_keeps_the_same_function(hidden: int) -> None:
    policy = _trained_looking(hidden)
    features = contexts(200, seed=12)
    shifted = Normaliser.fit(policy.space.matrix(contexts(200, seed=13)) * 1.7 + 0.3)
    moved = policy.derive("v8", normaliser=shifted)
    np.testing.assert_allclose(
        moved.p_show_batch(features), policy.p_show_batch(features), atol=1e-9
    )


def test_builtin_shows_confident_suggestions_and_silences_unsure_ones() -> None:
    policy = builtin_policy()
    confident = extract_features(REQUEST, "readline()", Generation("", [-0.05] * 4), Signals())
    unsure = extract_features(REQUEST, "readline()", Generation("", [-2.5] * 4), Signals())
    assert policy.p_show(confident) > 0.9
    assert policy.p_show(unsure) < 0.1


FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_an_artifact_from_the_torch_era_loads_and_decides_as_it_did() -> None:
    """An MLP policy saved when serving still ran torch: same bytes back, same probabilities."""
    recorded = json.loads((FIXTURES / "gate-policy-v1-mlp.json").read_text())
    artifact = recorded["artifact"].encode()
    policy = from_artifact(artifact)
    assert policy.weights.hidden == 8
    assert to_artifact(policy) == artifact
    np.testing.assert_allclose(
        policy.p_show_batch(recorded["features"]), recorded["p_show"], rtol=0, atol=1e-12
    )


def test_gate_languages_are_lsp_ids_of_the_language_table_and_keep_their_columns() -> None:
    assert set(LANGUAGES) <= set(languages.BY_ID)
    # The default one-hot columns are part of every artefact's feature space: pinned.
    assert FeatureSpace().categorical == (
        (
            "language",
            (
                "python",
                "javascript",
                "typescript",
                "typescriptreact",
                "javascriptreact",
                "go",
                "rust",
                "java",
                "c",
                "cpp",
                "csharp",
                "ruby",
                "php",
                "lua",
                "shellscript",
                "other",
            ),
        ),
    )
    known = extract_features(CompletionRequest("", "", language="kotlin"), "x", None, Signals())
    assert known["language"] == "other"  # in the table, not (yet) a column of the gate


def _with_model(artifact: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The artefact with its model section changed and its checksum made right again."""
    doc = json.loads(artifact)
    doc.pop("checksum")
    change(doc["model"])
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return json.dumps({**doc, "checksum": "sha256:" + hashlib.sha256(body).hexdigest()}).encode()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda m: m["state"].pop("mlp_in.bias"), id="missing-parameter"),
        pytest.param(lambda m: m["state"].update(extra=[0.0]), id="extra-parameter"),
        pytest.param(lambda m: m.update(hidden=4), id="wrong-hidden"),
        pytest.param(lambda m: m["state"]["linear.weight"][0].pop(), id="wrong-shape"),
        pytest.param(lambda m: m["state"].update({"linear.bias": ["x"]}), id="not-a-number"),
        pytest.param(lambda m: m["state"]["mlp_in.weight"][0].pop(), id="ragged"),
    ],
)
def test_a_model_that_does_not_fit_its_feature_space_is_refused(
    change: Callable[[dict[str, Any]], None],
) -> None:
    artifact = _with_model(to_artifact(_trained_looking(8)), change)
    with pytest.raises(PolicyError):
        from_artifact(artifact)


def test_serving_weights_are_read_only() -> None:
    policy = builtin_policy()
    with pytest.raises(ValueError):
        policy.weights.linear_bias[0] = 1.0
    assert isinstance(policy.weights, ShowWeights)
