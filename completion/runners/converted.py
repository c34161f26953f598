"""What the runners on converted weights share: CTranslate2 (`completion.runners.ct2`) and ONNX
Runtime GenAI (`completion.runners.onnx`).

Both serve a model converted once into the cache (`completion.runners.conversion`), serve an
adapter by merging it into the base weights and converting that (`completion.runners.merge`),
and read text with the model's own tokenizer. What differs is how each loads a converted model
(`_load`) and what it resets when another one starts serving (`install`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.memory import trim_heap
from completion.healing import VocabIndex
from completion.runners.base import PreparedModel
from completion.runners.conversion import LAYOUTS, Engine, checksum
from completion.runners.conversion import Progress as ConversionProgress
from completion.runners.loading import ModelSource
from completion.runners.tokens import vocab_index


class ConvertedRunner:
    """The adapter, identity and tokenizer methods of a runner on converted weights."""

    ENGINE: Engine  # the conversion's engine
    MODEL_TAG: str  # the model id's suffix: "+{MODEL_TAG}{layout}-{compute_type}"

    source: ModelSource
    cache_dir: Path
    compute_type: str
    base_path: Path
    base_model_id: str
    tokenizer: Any
    stop_ids: frozenset[int]
    _vocab: VocabIndex | None

    def _load(self, path: Path) -> Any:
        """The engine's model on the converted weights at `path`."""
        raise NotImplementedError

    def install(self, prepared: PreparedModel) -> None:
        """Serve `prepared` from the next request on; a request in progress finishes first."""
        raise NotImplementedError

    def _model_id(self, version: str | None) -> str:
        adapter = f"+{version}" if version else ""
        # The converted layout, after the first, is part of the id: its weights differ.
        layout = LAYOUTS[self.ENGINE]
        tag = self.MODEL_TAG if layout == 1 else f"{self.MODEL_TAG}{layout}"
        return f"{self.base_model_id}{adapter}+{tag}-{self.compute_type}"

    def prepare_adapter(
        self, adapter: Path | None, *, progress: ConversionProgress | None = None
    ) -> PreparedModel:
        """A model on base + `adapter` (None: the base model alone), loaded but not serving.

        The first time an adapter version is asked for, it is merged into the base weights and
        converted (`completion.runners.merge`; about 30 s for the bundled model on 2 cores), then
        found in the cache. This touches nothing that serves, so it runs on any thread while
        requests go on. Raises `AdapterError` for a damaged or foreign adapter, `ConversionError`
        when merging or converting fails.
        """
        from completion.runners.merge import serving_weights

        path, version = serving_weights(
            self.source,
            adapter,
            self.compute_type,
            self.cache_dir,
            self.base_path,
            progress=progress,
            engine=self.ENGINE,
        )
        return PreparedModel(
            adapter=adapter,
            path=path,
            generator=self._load(path),
            model_id=self._model_id(version),
            weights_sha256=checksum(path) or "",
        )

    def swap_adapter(self, adapter: Path | None) -> None:
        """Serve `adapter` (merged and converted once, `prepare_adapter`) from the next request
        on, or the base model alone for None; no restart.

        On any failure the serving model keeps serving and the error is raised. The server runs
        the slow part (`prepare_adapter`) off the model thread and only `install` on it.
        """
        self.install(self.prepare_adapter(adapter))

    def count_tokens(self, text: str) -> int:
        """Number of tokens `text` takes in this model's tokenizer."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def vocab_index(self) -> VocabIndex:
        """The decoded text of every token, built at the first healed request."""
        if self._vocab is None:
            self._vocab = vocab_index(self.tokenizer, self.stop_ids)
            trim_heap()  # the whole vocabulary decoded twice on the way: about 20 MB
        return self._vocab
