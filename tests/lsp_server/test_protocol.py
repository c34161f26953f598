"""Parameters of tabloop's methods are read leniently and written with camelCase keys."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
from lsprotocol import types

from lsp_server.protocol import (
    SEARCH_K_MAX,
    DecisionParams,
    SearchHit,
    SearchParams,
    TelemetryEnabledParams,
    read_params,
    to_wire,
)

Wire = namedtuple("Wire", ["decisionId"])


@pytest.mark.parametrize(
    ("params", "kind", "expected"),
    [
        pytest.param({"decisionId": "d1"}, DecisionParams, DecisionParams("d1"), id="dict"),
        pytest.param(Wire("d1"), DecisionParams, DecisionParams("d1"), id="pygls-namedtuple"),
        pytest.param({"decisionId": 5}, DecisionParams, None, id="not-a-string"),
        pytest.param({}, DecisionParams, None, id="missing"),
        pytest.param(
            {"enabled": False}, TelemetryEnabledParams, TelemetryEnabledParams(False), id="bool"
        ),
        pytest.param({"enabled": "no"}, TelemetryEnabledParams, None, id="not-a-bool"),
        pytest.param(None, SearchParams, SearchParams(), id="no-params"),
        pytest.param({"query": None, "k": None}, SearchParams, SearchParams(), id="nulls"),
    ],
)
def test_read_params(params: Any, kind: type[Any], expected: Any) -> None:
    assert read_params(params, kind) == expected


@pytest.mark.parametrize(
    ("k", "limit"),
    [
        pytest.param(None, 10, id="default"),
        pytest.param(0, 10, id="zero-is-default"),
        pytest.param(-3, 1, id="at-least-one"),
        pytest.param(10_000, SEARCH_K_MAX, id="at-most-max"),
    ],
)
def test_search_limit(k: int | None, limit: int) -> None:
    assert SearchParams(query="q", k=k).limit() == limit


def test_search_hit_on_the_wire() -> None:
    start, end = types.Position(line=3, character=0), types.Position(line=9, character=0)
    hit = SearchHit("file:///a.py", types.Range(start=start, end=end), 0.5, "def a():", ["a"])
    assert to_wire(hit) == {
        "uri": "file:///a.py",
        "range": {"start": {"line": 3, "character": 0}, "end": {"line": 9, "character": 0}},
        "score": 0.5,
        "preview": "def a():",
        "symbols": ["a"],
    }
