"""Tables of the index sync (migration `0003_index_sync`).

Nothing here holds code or paths: node paths are keyed segments joined by `/`, chunk keys and
hashes are HMACs made on the client. Every table carries `tenant_id`, and every query filters on
it, so one tenant's tree, placements and vectors are invisible to every other.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.models import Base, BigId

PATH_CHARS = 2048


class SyncWorkspace(Base):
    """One keyed workspace of a tenant, per embedding model, with its verified root."""

    __tablename__ = "sync_workspaces"
    __table_args__ = (
        UniqueConstraint("tenant_id", "workspace", "model", name="uq_sync_workspaces_key"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    workspace: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(32))
    root: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SyncNode(Base):
    """A file or directory of a workspace's keyed tree; `path` "" is the root."""

    __tablename__ = "sync_nodes"
    __table_args__ = (Index("ix_sync_nodes_parent", "workspace_id", "parent"),)

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("sync_workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(PATH_CHARS), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    parent: Mapped[str] = mapped_column(String(PATH_CHARS))
    name: Mapped[str] = mapped_column(String(32))
    is_dir: Mapped[bool] = mapped_column(Boolean)
    hash: Mapped[str] = mapped_column(String(64))


class SyncPlacement(Base):
    """Where a chunk lies in a file: the file's keyed path, its line range, its chunk key."""

    __tablename__ = "sync_placements"

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("sync_workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(PATH_CHARS), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    chunk: Mapped[str] = mapped_column(String(32))
    start_line: Mapped[int] = mapped_column(Integer)
    end_line: Mapped[int] = mapped_column(Integer)


class SyncVector(Base):
    """A chunk's embedding, content-addressed within a tenant and model."""

    __tablename__ = "sync_vectors"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(32), primary_key=True)
    chunk: Mapped[str] = mapped_column(String(32), primary_key=True)
    dtype: Mapped[str] = mapped_column(String(8))
    dimension: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
