"""The policy registry's store: a tenant's versions, what serves, and the history of changes.

`PolicyVersions` stores versions (`add`, verified on read by `policy`), reads the serving state
from the history rows (`serving_version`, `canary`, `pending_approval`, `serving_artifact`),
writes those rows (`_record`) in transactions that hold the tenant's registry (`_serialised`),
and prunes versions that never served. The transitions between states (promote, canary,
approval, rollback) are `backend.policy.registry.PolicyRegistry`'s, built on this.

Nothing stored here carries an infinity or a NaN: JSON has neither (PostgreSQL's JSONB and the
artefact's canonical form refuse them), so a report's non-finite numbers are stored as null and
a policy with non-finite weights is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.db.models import Tenant
from backend.policy.models import ACTOR_MAX_CHARS, PolicyPromotionRow, PolicyVersionRow
from backend.storage import Storage
from completion.gate import (
    BUILTIN_VERSION,
    CanaryPolicy,
    Policy,
    PolicyError,
    builtin_policy,
    from_artifact,
    to_artifact,
)


class RegistryError(Exception):
    """An operation on the registry that cannot be done (unknown version, ...)."""


SERVING_ACTIONS = ("promote", "rollback", "canary-promote", "canary-rollback")
CANARY = "canary"
PENDING = "pending-approval"
APPROVE = "approve"
# Versions named by these rows were (or are waiting to be) in front of users: never pruned.
KEPT_ACTIONS = (*SERVING_ACTIONS, CANARY, PENDING, APPROVE)
OPERATOR = "operator"


@dataclass(frozen=True)
class CanaryState:
    """A version serving a share of decisions beside the serving one."""

    version: str
    previous: str
    share: float
    started_at: datetime


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
    state: str = "candidate"  # serving | canary | pending-approval | rolled-back | candidate

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "parent": self.parent_version,
            "created_at": self.created_at.isoformat(),
            "checksum": self.checksum,
            "serving": self.serving,
            "rolled_back": self.rolled_back,
            "state": self.state,
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


def _state(
    row: PolicyVersionRow, serving: str, canary: CanaryState | None, pending: set[str]
) -> str:
    if row.version == serving:
        return "serving"
    if canary is not None and row.version == canary.version:
        return CANARY
    if row.version in pending:
        return PENDING
    return "rolled-back" if row.rolled_back else "candidate"


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float (anywhere inside) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


class PolicyVersions:
    """Policy versions of tenants, stored next to their events, and the serving state."""

    def __init__(self, storage: Storage, *, builtin_floor: float = 0.05) -> None:
        self.storage = storage
        self._builtin = builtin_policy(show_floor=builtin_floor)
        self._builtin_artifact = to_artifact(self._builtin)
        # Checked inside every write's transaction, just before it commits (`fenced`).
        self._fence: Callable[[Session], None] | None = None

    def fenced(self, fence: Callable[[Session], None]) -> Self:
        """This registry, whose every write first runs `fence(session)` in its own transaction.

        A trainer on a shared database passes a check that it still holds its training job
        (`backend.cluster.JobQueue.fence`): a trainer that lost it (paused past its lease, and
        another took the job over) raises there, and its promotion is never committed.
        """
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._fence = fence
        return copy

    def _commit(self, session: Session) -> None:
        if self._fence is not None:
            self._fence(session)
        session.commit()

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
                    self._commit(session)
                except IntegrityError:
                    session.rollback()
                    continue
                return policy
        raise RegistryError("could not allocate a version number")

    def versions(self, tenant_id: int) -> list[PolicyRecord]:
        """Every version of a tenant, oldest first."""
        serving = self.serving_version(tenant_id)
        canary = self.canary(tenant_id)
        pending = set(self.pending_approval(tenant_id))
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
                state=_state(row, serving, canary, pending),
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

    @contextmanager
    def _serialised(self, tenant_id: int) -> Iterator[Session]:
        """A session whose transaction holds the tenant's registry until it ends.

        Every action that changes what serves reads the state it acts on and writes its row in
        one such transaction, so two actions on a tenant never interleave: on PostgreSQL the
        tenant's row is locked (`SELECT … FOR NO KEY UPDATE`; other tenants' actions and the
        tenant's ingestion go on), on SQLite the transaction takes the database's write lock at
        its start (`BEGIN IMMEDIATE`).
        """
        with self.storage.session() as session:
            if self.storage.dialect == "sqlite":
                session.execute(text("BEGIN IMMEDIATE"))
            else:
                # NO KEY UPDATE: exclusive among registry actions, yet no wait for the key-share
                # locks that inserting the tenant's events takes on its row.
                session.execute(
                    select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
                )
            yield session

    def serving_version(self, tenant_id: int) -> str:
        """Name of the version that serves the tenant now (beside a canary, if one runs)."""
        with self.storage.session() as session:
            return self._serving_in(session, tenant_id)

    def _serving_in(self, session: Session, tenant_id: int) -> str:
        latest = self._latest(session, tenant_id, SERVING_ACTIONS)
        return latest.version if latest is not None and latest.version else BUILTIN_VERSION

    def canary(self, tenant_id: int) -> CanaryState | None:
        """The canary running for the tenant, if any."""
        with self.storage.session() as session:
            return self._canary_in(session, tenant_id)

    def _canary_in(self, session: Session, tenant_id: int) -> CanaryState | None:
        latest = self._latest(session, tenant_id, (*SERVING_ACTIONS, CANARY))
        if latest is None or latest.action != CANARY or latest.version is None:
            return None
        figures = latest.figures or {}
        return CanaryState(
            version=latest.version,
            previous=str(figures.get("previous") or BUILTIN_VERSION),
            share=float(figures.get("share", 0.0)),
            started_at=latest.created_at,
        )

    def pending_approval(self, tenant_id: int) -> list[str]:
        """Versions waiting for `approve`, oldest first."""
        with self.storage.session() as session:
            last = self._last_actions(session, tenant_id)
        return [version for version, action in last.items() if action == PENDING]

    @staticmethod
    def _last_actions(session: Session, tenant_id: int) -> dict[str, str]:
        """The last action that named each version, in the order of those actions."""
        rows = session.execute(
            select(PolicyPromotionRow.version, PolicyPromotionRow.action)
            .where(PolicyPromotionRow.tenant_id == tenant_id)
            .order_by(PolicyPromotionRow.id)
        ).all()
        last: dict[str, str] = {}
        for version, action in rows:
            if version is not None:
                last.pop(version, None)
                last[version] = action
        return last

    @staticmethod
    def _latest(
        session: Session, tenant_id: int, actions: tuple[str, ...]
    ) -> PolicyPromotionRow | None:
        return session.scalars(
            select(PolicyPromotionRow)
            .where(
                PolicyPromotionRow.tenant_id == tenant_id,
                PolicyPromotionRow.action.in_(actions),
            )
            .order_by(PolicyPromotionRow.id.desc())
            .limit(1)
        ).first()

    def serving_policy(self, tenant_id: int) -> Policy:
        return self.policy(tenant_id, self.serving_version(tenant_id))

    def serving_artifact(self, tenant_id: int) -> ServedArtifact:
        """The artefact clients of the tenant should run."""
        canary = self.canary(tenant_id)
        if canary is not None:
            mixture = CanaryPolicy(
                **{
                    field.name: getattr(self.policy(tenant_id, canary.version), field.name)
                    for field in dataclasses.fields(Policy)
                },
                previous=self.policy(tenant_id, canary.previous),
                share=canary.share,
            )
            return ServedArtifact(canary.version, to_artifact(mixture))
        version = self.serving_version(tenant_id)
        if version == BUILTIN_VERSION:
            return ServedArtifact(version, self._builtin_artifact)
        with self.storage.session() as session:
            row = self._row(session, tenant_id, version)
            return ServedArtifact(version, row.artifact.encode())

    def prune(self, tenant_id: int, keep: int) -> list[str]:
        """Delete versions that never served (nor wait to), beyond the newest `keep` of them;
        returns the versions deleted."""
        with self._serialised(tenant_id) as session:
            named = set(
                session.scalars(
                    select(PolicyPromotionRow.version).where(
                        PolicyPromotionRow.tenant_id == tenant_id,
                        PolicyPromotionRow.action.in_(KEPT_ACTIONS),
                        PolicyPromotionRow.version.is_not(None),
                    )
                ).all()
            )
            rows = session.scalars(
                select(PolicyVersionRow)
                .where(PolicyVersionRow.tenant_id == tenant_id)
                .order_by(PolicyVersionRow.number.desc())
            ).all()
            unpromoted = [row for row in rows if row.version not in named]
            doomed = unpromoted[keep:]
            for row in doomed:
                session.delete(row)
            self._commit(session)
        return [row.version for row in doomed]

    @staticmethod
    def _record(
        session: Session,
        tenant_id: int,
        version: str | None,
        action: str,
        actor: str | None,
        reason: str,
        figures: dict[str, Any] | None,
    ) -> None:
        if actor is not None and len(actor) > ACTOR_MAX_CHARS:
            raise RegistryError(f"who acted is at most {ACTOR_MAX_CHARS} characters")
        session.add(
            PolicyPromotionRow(
                tenant_id=tenant_id,
                version=None if version in (None, BUILTIN_VERSION) else version,
                action=action,
                actor=actor or OPERATOR,
                reason=reason[:512],
                created_at=datetime.now(UTC),
                figures=finite_json(figures) if figures is not None else None,
            )
        )

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
                "figures": row.figures,
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
