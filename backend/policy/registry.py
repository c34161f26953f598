"""The per-tenant policy registry: versions, one serving, canaries, approvals, rollback.

`policy_promotions` is the history of a tenant's policies, one row per transition:

- `promote`, `rollback`, `canary-promote`, `canary-rollback` set the serving version (the newest
  such row's version; no row, or a row with no version, means the built-in policy);
- `canary` starts a canary: the version serves a share of decisions beside the serving one until
  a `canary-promote` (it serves alone) or a `canary-rollback` (it is marked rolled back);
- `pending-approval` holds a candidate that passed evaluation for a tenant that requires
  approval; `approve` releases it (into a canary, or straight to serving with no canary share).

A rollback marks the serving version as rolled back and serves the newest earlier promoted
version that was not rolled back itself (else the built-in). Rows carry the figures a transition
was judged on. Versions never promoted are pruned beyond the newest few (`prune`).

The transitions are here; storing versions, reading the serving state from the history and
writing its rows are `backend.policy.versions.PolicyVersions`'s, which `PolicyRegistry` extends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.policy.models import PolicyPromotionRow, PolicyVersionRow
from backend.policy.settings import TrainerSettings
from backend.policy.versions import (
    APPROVE,
    CANARY,
    PENDING,
    SERVING_ACTIONS,
    PolicyVersions,
    RegistryError,
)
from completion.gate import BUILTIN_VERSION


class PolicyRegistry(PolicyVersions):
    """Policy versions of tenants and the transitions of what serves them (the module)."""

    def promote(
        self,
        tenant_id: int,
        version: str,
        *,
        actor: str | None = None,
        reason: str = "",
        figures: dict[str, Any] | None = None,
        action: str = "promote",
    ) -> None:
        """Make `version` the serving one (clearing a rollback mark it may carry); a canary
        running ends with it. Promoting the version that serves alone already records nothing
        (a replayed request changes nothing)."""
        with self._serialised(tenant_id) as session:
            current = self._serving_in(session, tenant_id)
            if current == version and self._canary_in(session, tenant_id) is None:
                return
            self._promote_in(session, tenant_id, version, current, actor, reason, figures, action)
            self._commit(session)

    def _promote_in(
        self,
        session: Session,
        tenant_id: int,
        version: str,
        current: str,
        actor: str | None,
        reason: str,
        figures: dict[str, Any] | None,
        action: str,
    ) -> None:
        if version != BUILTIN_VERSION:
            self._row(session, tenant_id, version).rolled_back = False
        figures = {**(figures or {}), "previous": current}
        self._record(session, tenant_id, version, action, actor, reason, figures)

    def start_canary(
        self,
        tenant_id: int,
        version: str,
        *,
        share: float,
        actor: str | None = None,
        reason: str = "",
        figures: dict[str, Any] | None = None,
    ) -> None:
        """Let `version` make `share` of the decisions beside the serving version."""
        if not 0.0 < share <= 1.0:
            raise RegistryError(f"canary share {share} outside (0, 1]")
        with self._serialised(tenant_id) as session:
            self._start_canary_in(session, tenant_id, version, share, actor, reason, figures)
            self._commit(session)

    def _start_canary_in(
        self,
        session: Session,
        tenant_id: int,
        version: str,
        share: float,
        actor: str | None,
        reason: str,
        figures: dict[str, Any] | None,
    ) -> None:
        previous = self._serving_in(session, tenant_id)
        self._row(session, tenant_id, version)  # it must exist
        self._record(
            session,
            tenant_id,
            version,
            CANARY,
            actor,
            reason or f"canary at {share:.0%} beside {previous}",
            {**(figures or {}), "share": share, "previous": previous},
        )

    def finish_canary(
        self,
        tenant_id: int,
        *,
        promote: bool,
        actor: str | None = None,
        reason: str = "",
        figures: dict[str, Any] | None = None,
        version: str | None = None,
    ) -> str:
        """End the running canary: it serves alone (`promote`) or is rolled back; returns the
        version serving now. Raises `RegistryError` when no canary runs, or when it is not
        `version` (the canary that was judged) where one is given."""
        with self._serialised(tenant_id) as session:
            serving = self._finish_canary_in(
                session, tenant_id, promote, actor, reason, figures, version
            )
            self._commit(session)
        return serving

    def _finish_canary_in(
        self,
        session: Session,
        tenant_id: int,
        promote: bool,
        actor: str | None,
        reason: str,
        figures: dict[str, Any] | None,
        version: str | None,
    ) -> str:
        canary = self._canary_in(session, tenant_id)
        if canary is None:
            raise RegistryError("no canary is running")
        if version is not None and canary.version != version:
            raise RegistryError(f"the canary running is {canary.version}, not {version}")
        if promote:
            self._record(
                session,
                tenant_id,
                canary.version,
                "canary-promote",
                actor,
                reason,
                {**(figures or {}), "previous": canary.previous},
            )
            return canary.version
        self._row(session, tenant_id, canary.version).rolled_back = True
        self._record(
            session,
            tenant_id,
            canary.previous,
            "canary-rollback",
            actor,
            reason or f"rollback of canary {canary.version}",
            {**(figures or {}), "of": canary.version},
        )
        return canary.previous

    def hold_for_approval(
        self,
        tenant_id: int,
        version: str,
        *,
        actor: str | None = None,
        reason: str = "",
        figures: dict[str, Any] | None = None,
    ) -> None:
        """`version` passed evaluation; it waits for `approve` (state `pending-approval`)."""
        with self._serialised(tenant_id) as session:
            self._row(session, tenant_id, version)
            self._record(session, tenant_id, version, PENDING, actor, reason, figures)
            self._commit(session)

    def approve(
        self,
        tenant_id: int,
        version: str,
        *,
        share: float | None = None,
        actor: str | None = None,
    ) -> str:
        """Release a version waiting for approval: into a canary at `share` (default: the
        trainer's default `canary_share`), or (share 0) straight to serving. Returns what it
        became (`canary` or `serving`).

        Approving a version approved already records nothing and returns its state (a replay);
        any other version that is not waiting raises `RegistryError`."""
        if share is None:
            share = float(TrainerSettings.model_fields["canary_share"].default)
        with self._serialised(tenant_id) as session:
            last = self._last_actions(session, tenant_id)
            if last.get(version) != PENDING:
                if self._approved_in(session, tenant_id, version):
                    canary = self._canary_in(session, tenant_id)
                    if canary is not None and canary.version == version:
                        return CANARY
                    if self._serving_in(session, tenant_id) == version:
                        return "serving"
                    return last.get(version, "candidate")
                raise RegistryError(f"{version} is not waiting for approval")
            self._record(session, tenant_id, version, APPROVE, actor, "approved", None)
            if share > 0:
                self._start_canary_in(session, tenant_id, version, share, actor, "approved", None)
                state = CANARY
            else:
                current = self._serving_in(session, tenant_id)
                self._promote_in(
                    session, tenant_id, version, current, actor, "approved", None, "promote"
                )
                state = "serving"
            self._commit(session)
        return state

    @staticmethod
    def _approved_in(session: Session, tenant_id: int, version: str) -> bool:
        return (
            session.scalar(
                select(func.count())
                .select_from(PolicyPromotionRow)
                .where(
                    PolicyPromotionRow.tenant_id == tenant_id,
                    PolicyPromotionRow.version == version,
                    PolicyPromotionRow.action == APPROVE,
                )
            )
            or 0
        ) > 0

    def rollback(
        self,
        tenant_id: int,
        *,
        version: str | None = None,
        actor: str | None = None,
        reason: str = "",
    ) -> str:
        """Serve the previous good version again; returns the version now serving. A running
        canary is what is rolled back when there is one.

        `version` names what the caller means to roll back (the running canary, else the
        serving version): when it was rolled back already by the newest change, nothing more is
        done (a replay); when it is anything else, `RegistryError` (a stale page must not roll
        back a version it never saw). Without it, whatever serves is rolled back."""
        with self._serialised(tenant_id) as session:
            canary = self._canary_in(session, tenant_id)
            current = canary.version if canary is not None else self._serving_in(session, tenant_id)
            if version is not None and version != current:
                latest = self._latest(session, tenant_id, SERVING_ACTIONS)
                if (
                    latest is not None
                    and latest.action in ("rollback", "canary-rollback")
                    and (latest.figures or {}).get("of") == version
                ):
                    return self._serving_in(session, tenant_id)
                raise RegistryError(f"{version} is not serving ({current} is): nothing rolled back")
            if canary is not None:
                serving = self._finish_canary_in(
                    session, tenant_id, False, actor, reason, None, canary.version
                )
                self._commit(session)
                return serving
            if current == BUILTIN_VERSION:
                raise RegistryError("the built-in policy is serving; there is nothing to roll back")
            self._row(session, tenant_id, current).rolled_back = True
            history = session.scalars(
                select(PolicyPromotionRow.version)
                .where(
                    PolicyPromotionRow.tenant_id == tenant_id,
                    PolicyPromotionRow.action.in_(SERVING_ACTIONS),
                )
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
            self._record(
                session,
                tenant_id,
                previous,
                "rollback",
                actor,
                reason or f"rollback of {current}",
                {"of": current},
            )
            self._commit(session)
        return previous or BUILTIN_VERSION
