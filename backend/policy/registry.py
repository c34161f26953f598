"""The per-tenant policy registry: every version kept, one serving, rollback by history.

The serving version of a tenant is the newest row of `policy_promotions`; no row (or a row with
no version) means the built-in policy. A rollback marks the serving version as rolled back and
serves the newest earlier promoted version that was not rolled back itself (else the built-in).

Nothing stored here carries an infinity or a NaN: JSON has neither (PostgreSQL's JSONB and the
artefact's canonical form refuse them), so a report's non-finite numbers are stored as null and
a policy with non-finite weights is refused.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.policy.models import PolicyPromotionRow, PolicyVersionRow
from backend.storage import Storage
from completion.gate import (
    BUILTIN_VERSION,
    Policy,
    PolicyError,
    builtin_policy,
    from_artifact,
    to_artifact,
)


class RegistryError(Exception):
    """An operation on the registry that cannot be done (unknown version, ...)."""


@dataclass(frozen=True)
class PolicyRecord:
    """A version as the registry lists it."""

    version: str
    parent_version: str | None
    created_at: datetime
    checksum: str
    serving: bool
    rolled_back: bool
    report: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "parent": self.parent_version,
            "created_at": self.created_at.isoformat(),
            "checksum": self.checksum,
            "serving": self.serving,
            "rolled_back": self.rolled_back,
            "promote": self.report.get("promote"),
            "reasons": self.report.get("reasons", []),
        }


@dataclass(frozen=True)
class ServedArtifact:
    """What `GET /v1/policy` answers: the artefact bytes, its version and entity tag."""

    version: str
    artifact: bytes

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.artifact).hexdigest()[:32] + '"'


def _checksum(artifact: bytes) -> str:
    return "sha256:" + hashlib.sha256(artifact).hexdigest()


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float (anywhere inside) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


class PolicyRegistry:
    """Policy versions of tenants, stored next to their events."""

    def __init__(self, storage: Storage, *, builtin_floor: float = 0.05) -> None:
        self.storage = storage
        self._builtin = builtin_policy(show_floor=builtin_floor)
        self._builtin_artifact = to_artifact(self._builtin)

    # -- versions -------------------------------------------------------------------------

    def add(self, tenant_id: int, make: Callable[[str], Policy], report: dict[str, Any]) -> Policy:
        """Store a new version; `make(version) -> Policy` builds it under the version's name.

        The name (`v<n>`, n counting per tenant) is chosen here; two trainers racing for the
        same number are told apart by the unique constraint and the loser takes the next one.
        Raises `RegistryError` for a policy that has no JSON form (a non-finite number).
        """
        report = finite_json(report)
        for _ in range(5):
            with self.storage.session() as session:
                number = (
                    session.scalar(
                        select(func.max(PolicyVersionRow.number)).where(
                            PolicyVersionRow.tenant_id == tenant_id
                        )
                    )
                    or 0
                ) + 1
                policy = make(f"v{number}")
                try:
                    artifact = to_artifact(policy)
                except ValueError as exc:  # json's "Out of range float values ..."
                    raise RegistryError(f"policy {policy.version} cannot be stored: {exc}") from exc
                session.add(
                    PolicyVersionRow(
                        tenant_id=tenant_id,
                        number=number,
                        version=policy.version,
                        parent_version=policy.metadata.get("parent"),
                        created_at=datetime.now(UTC),
                        checksum=_checksum(artifact),
                        artifact=artifact.decode(),
                        report=report,
                        rolled_back=False,
                    )
                )
                try:
                    session.commit()
                except IntegrityError:
                    session.rollback()
                    continue
                return policy
        raise RegistryError("could not allocate a version number")

    def versions(self, tenant_id: int) -> list[PolicyRecord]:
        """Every version of a tenant, oldest first."""
        serving = self.serving_version(tenant_id)
        with self.storage.session() as session:
            rows = session.scalars(
                select(PolicyVersionRow)
                .where(PolicyVersionRow.tenant_id == tenant_id)
                .order_by(PolicyVersionRow.number)
            ).all()
        return [
            PolicyRecord(
                version=row.version,
                parent_version=row.parent_version,
                created_at=row.created_at,
                checksum=row.checksum,
                serving=row.version == serving,
                rolled_back=row.rolled_back,
                report=row.report,
            )
            for row in rows
        ]

    def policy(self, tenant_id: int, version: str) -> Policy:
        """A stored version, verified; the built-in one by its name."""
        if version == BUILTIN_VERSION:
            return self._builtin
        with self.storage.session() as session:
            row = self._row(session, tenant_id, version)
            artifact = row.artifact.encode()
            if _checksum(artifact) != row.checksum:
                raise PolicyError(f"stored artefact of {version} does not match its checksum")
        return from_artifact(artifact)

    # -- serving --------------------------------------------------------------------------

    def serving_version(self, tenant_id: int) -> str:
        """Name of the version that serves the tenant now."""
        with self.storage.session() as session:
            latest = session.scalars(
                select(PolicyPromotionRow)
                .where(PolicyPromotionRow.tenant_id == tenant_id)
                .order_by(PolicyPromotionRow.id.desc())
                .limit(1)
            ).first()
        return latest.version if latest is not None and latest.version else BUILTIN_VERSION

    def serving_policy(self, tenant_id: int) -> Policy:
        return self.policy(tenant_id, self.serving_version(tenant_id))

    def serving_artifact(self, tenant_id: int) -> ServedArtifact:
        """The artefact clients of the tenant should run."""
        version = self.serving_version(tenant_id)
        if version == BUILTIN_VERSION:
            return ServedArtifact(version, self._builtin_artifact)
        with self.storage.session() as session:
            row = self._row(session, tenant_id, version)
            return ServedArtifact(version, row.artifact.encode())

    def promote(self, tenant_id: int, version: str, *, actor: str, reason: str = "") -> None:
        """Make `version` the serving one (clearing a rollback mark it may carry)."""
        with self.storage.session() as session:
            if version != BUILTIN_VERSION:
                self._row(session, tenant_id, version).rolled_back = False
            session.add(
                PolicyPromotionRow(
                    tenant_id=tenant_id,
                    version=None if version == BUILTIN_VERSION else version,
                    action="promote",
                    actor=actor[:64],
                    reason=reason[:512],
                    created_at=datetime.now(UTC),
                )
            )
            session.commit()

    def rollback(self, tenant_id: int, *, actor: str, reason: str = "") -> str:
        """Serve the previous good version again; returns the version now serving."""
        current = self.serving_version(tenant_id)
        if current == BUILTIN_VERSION:
            raise RegistryError("the built-in policy is serving; there is nothing to roll back")
        with self.storage.session() as session:
            self._row(session, tenant_id, current).rolled_back = True
            history = session.scalars(
                select(PolicyPromotionRow.version)
                .where(PolicyPromotionRow.tenant_id == tenant_id)
                .order_by(PolicyPromotionRow.id.desc())
            ).all()
            rolled = set(
                session.scalars(
                    select(PolicyVersionRow.version).where(
                        PolicyVersionRow.tenant_id == tenant_id,
                        PolicyVersionRow.rolled_back.is_(True),
                    )
                ).all()
            )
            previous = next(
                (v for v in history if v is not None and v != current and v not in rolled), None
            )
            session.add(
                PolicyPromotionRow(
                    tenant_id=tenant_id,
                    version=previous,
                    action="rollback",
                    actor=actor[:64],
                    reason=(reason or f"rollback of {current}")[:512],
                    created_at=datetime.now(UTC),
                )
            )
            session.commit()
        return previous or BUILTIN_VERSION

    def history(self, tenant_id: int) -> list[dict[str, Any]]:
        """Promotions and rollbacks of a tenant, oldest first."""
        with self.storage.session() as session:
            rows = session.scalars(
                select(PolicyPromotionRow)
                .where(PolicyPromotionRow.tenant_id == tenant_id)
                .order_by(PolicyPromotionRow.id)
            ).all()
        return [
            {
                "version": row.version or BUILTIN_VERSION,
                "action": row.action,
                "actor": row.actor,
                "reason": row.reason,
                "at": row.created_at.isoformat(),
            }
            for row in rows
        ]

    @staticmethod
    def _row(session: Session, tenant_id: int, version: str) -> PolicyVersionRow:
        row = session.scalars(
            select(PolicyVersionRow).where(
                PolicyVersionRow.tenant_id == tenant_id, PolicyVersionRow.version == version
            )
        ).first()
        if row is None:
            raise RegistryError(f"no policy version {version!r}")
        return row
