"""`tabloop bench index`: the pipeline's time split into the model's calls and the rest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest

from evaluation.bench.index import Run, TimedEmbedder, pipeline_figures


class _UnitEmbedder:
    """Stands for the model: unit vectors."""

    model_id = "test:unit"
    dimension = 4
    max_tokens = 128
    counter = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.ones((len(texts), self.dimension), np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_timed_embedder_counts_calls_and_passes_vectors_on() -> None:
    timed = TimedEmbedder(cast(Any, _UnitEmbedder()))
    assert timed.embed(["a", "b", "c"]).shape == (3, 4)
    timed.embed(["d"])
    assert timed.calls == [3, 1]
    assert timed.seconds > 0
    timed.reset()
    assert (timed.calls, timed.seconds) == ([], 0.0)


@pytest.mark.parametrize(
    ("embed_runs", "pipe_runs", "expected"),
    [
        pytest.param(
            [Run(2.0, 3.0, 100), Run(1.0, 2.0, 100)],
            [Run(1.2, 2.2, 100, 1.0, (60, 40)), Run(1.5, 2.5, 100, 1.2, (60, 40))],
            {
                "embed_only_chunks_per_s": 100.0,
                "index_chunks_per_s": 83.33,
                "pipeline_overhead": 0.2,
                "pipeline_model_s": 1.0,
                "pipeline_outside_model_s": 0.2,
                "outside_model_overhead": 0.2,
                "model_calls_overhead": 0.0,
                "pipeline_model_calls": [60, 40],
            },
            id="best-of-each-kind",
        ),
        pytest.param(
            [Run(1.0, 2.0, 100)],
            [Run(1.1, 2.0, 110, 1.0, (110,))],
            {"pipeline_overhead": 0.0, "model_calls_overhead": -0.091, "chunks_embedded": 110},
            id="rates-per-chunk-when-the-pipeline-embeds-more",
        ),
    ],
)
def test_pipeline_figures(
    embed_runs: list[Run], pipe_runs: list[Run], expected: dict[str, object]
) -> None:
    figures = pipeline_figures(embed_runs, pipe_runs)
    assert {key: figures[key] for key in expected} == expected
