"""`tabloop train` and `tabloop policy list|promote V|rollback`.

tabloop train [--tenant NAME] [--db URL] [--lambda 0.25] [--json]
tabloop policy list [--tenant NAME] [--db URL] [--json]
tabloop policy promote VERSION [--tenant NAME] [--db URL] [--actor NAME]
tabloop policy rollback [--tenant NAME] [--db URL] [--actor NAME]
tabloop policy approve VERSION [--tenant NAME] [--db URL] [--canary-share 0.1] [--actor NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from backend.policy.loop import run_training, tenant_ids
from backend.policy.registry import PolicyRegistry, RegistryError
from backend.policy.settings import TrainerSettings
from backend.storage import Storage, default_db_url


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, help=f"database URL (default: {default_db_url()})")
    parser.add_argument("--tenant", default=None, help="tenant name (default: the only one)")


def _tenant(storage: Storage, name: str | None) -> int:
    if name is not None:
        try:
            return storage.ensure_tenant(name)
        except ValueError as exc:  # a name a new tenant may not have
            raise SystemExit(f"--tenant {name!r}: {exc}") from None
    ids = tenant_ids(storage)
    if len(ids) != 1:
        raise SystemExit(f"{len(ids)} tenants in the database: name one with --tenant")
    return ids[0]


def train_main(argv: list[str]) -> int:
    """Entry point of `tabloop train`: one training run per tenant, printed as JSON."""
    parser = argparse.ArgumentParser(
        prog="tabloop train",
        description="Train a candidate policy from the events in the backend's database, judge "
        "it off-policy against the serving one, and promote it if it is better.",
    )
    _common(parser)
    parser.add_argument(
        "--lambda",
        dest="distraction_cost",
        type=float,
        default=None,
        help="cost of an ignored suggestion, in characters (default: the trainer's)",
    )
    parser.add_argument("--min-events", type=int, default=None, help="fewest rewarded decisions")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    args = parser.parse_args(argv)
    settings = TrainerSettings.model_validate({})
    if args.distraction_cost is not None:
        settings.rewards.distraction_cost = args.distraction_cost
    if args.min_events is not None:
        settings.min_events = args.min_events
    storage = Storage(args.db or default_db_url())
    try:
        tenants = [_tenant(storage, args.tenant)] if args.tenant else tenant_ids(storage)
        summaries = [run_training(storage, t, settings).as_json() for t in tenants]
    finally:
        storage.close()
    if args.json:
        print(json.dumps({"runs": summaries}, indent=2))
    else:
        for s in summaries:
            verdict = "promoted" if s["promoted"] else "not promoted"
            reasons = "; ".join(s["report"].get("reasons", [])) or s["report"].get("skipped", "")
            print(
                f"tenant {s['tenant_id']}: {s['candidate'] or 'no candidate'} {verdict} ({reasons})"
            )
    return 0


def policy_main(argv: list[str]) -> int:
    """Entry point of `tabloop policy list|promote V|rollback`."""
    parser = argparse.ArgumentParser(prog="tabloop policy", description="the policy registry")
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="every version, the serving one marked")
    _common(listing)
    listing.add_argument("--json", action="store_true")
    promote = sub.add_parser("promote", help="serve a version")
    promote.add_argument("version")
    _common(promote)
    rollback = sub.add_parser(
        "rollback", help="serve the previous version again (or end the running canary)"
    )
    _common(rollback)
    approve = sub.add_parser("approve", help="release a version waiting for approval")
    approve.add_argument("version")
    approve.add_argument(
        "--canary-share",
        type=float,
        default=None,
        help="share of decisions it makes first (default: the trainer's; 0 serves it at once)",
    )
    _common(approve)
    for acting in (promote, rollback, approve):
        acting.add_argument(
            "--actor", default="cli", help="who acts, as the history records it (default: cli)"
        )
    args = parser.parse_args(argv)
    storage = Storage(args.db or default_db_url())
    try:
        tenant = _tenant(storage, args.tenant)
        registry = PolicyRegistry(storage)
        if args.action == "list":
            _print_list(registry, tenant, args.json)
        elif args.action == "approve":
            share = args.canary_share
            if share is None:
                share = TrainerSettings.model_validate({}).canary_share
            state = registry.approve(tenant, args.version, share=share, actor=args.actor)
            print(f"{args.version}: {state}")
        elif args.action == "promote":
            registry.promote(tenant, args.version, actor=args.actor, reason="promoted by hand")
            print(f"serving {args.version}")
        else:
            print(f"serving {registry.rollback(tenant, actor=args.actor)}")
    except RegistryError as exc:
        print(f"tabloop policy: {exc}", file=sys.stderr)
        return 1
    finally:
        storage.close()
    return 0


def _print_list(registry: PolicyRegistry, tenant: int, as_json: bool) -> None:
    records = registry.versions(tenant)
    if as_json:
        doc: dict[str, Any] = {
            "serving": registry.serving_version(tenant),
            "versions": [r.as_json() for r in records],
            "history": registry.history(tenant),
        }
        print(json.dumps(doc, indent=2))
        return
    print(f"serving: {registry.serving_version(tenant)}")
    for r in records:
        mark = {"serving": "*", "canary": "~", "pending-approval": "?", "rolled-back": "x"}.get(
            r.state, " "
        )
        candidate = r.report.get("candidate", {}).get("dr", {}).get("value")
        serving = r.report.get("serving", {}).get("dr", {}).get("value")
        estimate = (
            f"DR {candidate:+.4f} vs {serving:+.4f}"
            if candidate is not None and serving is not None
            else ""
        )
        when = f"{r.created_at:%Y-%m-%d %H:%M}"
        print(f"{mark} {r.version:<6} {when} {r.state:<16} parent={r.parent_version} {estimate}")


if __name__ == "__main__":
    sys.exit(policy_main(sys.argv[1:]))
