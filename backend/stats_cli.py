"""`tabloop stats`: the dashboard's Overview in the terminal.

tabloop stats [--tenant NAME] [--window 24h] [--by model|policy|language|editor] [--db URL]
              [--json]

Reads the backend's database with the same code as `GET /v1/stats/overview` (SQL aggregation in
the database), so a terminal and the browser show the same figures. `--by` adds the split of
`GET /v1/stats/by/{dimension}`: one row per model (adapter) version, policy version, language or
editor. The model versions' promotions, canaries and rollbacks come from the tenants' adapter
registries under the cache directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from backend.policy.loop import tenant_ids
from backend.policy.registry import PolicyRegistry
from backend.services.stats import DIMENSIONS, WINDOWS, StatsService
from backend.services.stats_rollup import StatsRollup
from backend.storage import Storage, default_db_url


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"


def overview_table(doc: dict[str, Any]) -> Table:
    """The Overview's summary as a rich table."""
    s = doc["summary"]
    # Names come from the database: shown as plain text, never read as Rich markup.
    title = f"{doc['tenant']}, last {doc['window']} (serving policy {doc['serving']}"
    table = Table(title=Text(f"{title}, model {doc.get('model_serving', 'base')})"))
    table.add_column("figure")
    table.add_column("value", justify="right")
    silences = s["silences"]
    rows = [
        ("requests", f"{s['requests']:,}"),
        ("shown", _pct(s["shown_share"])),
        ("accepted (full)", _pct(s["accept_rate"])),
        ("accepted (partial)", _pct(s["partial_rate"])),
        ("accepted characters", f"{s['accepted_chars']:,}"),
        *(
            (f"retained after {after} s", f"{chars:,} ({_pct(s['retained_share'][after])})")
            for after, chars in s["retained_chars"].items()
        ),
        *((f"silenced: {reason}", f"{count:,}") for reason, count in silences.items()),
        ("latency p50", _ms(s["latency_ms"]["p50"])),
        ("latency p95", _ms(s["latency_ms"]["p95"])),
        ("promotions and rollbacks", str(len(doc["markers"]))),
        ("model promotions and rollbacks", str(len(doc.get("model_markers", [])))),
    ]
    for name, value in rows:
        table.add_row(Text(name), Text(value))
    return table


def split_table(doc: dict[str, Any]) -> Table:
    """A split (`StatsService.split`) as a rich table: one row per value."""
    table = Table(title=Text(f"{doc['tenant']}, last {doc['window']}, by {doc['by']}"))
    for name in ("value", "requests", "shown", "accepted", "accepted chars", "latency p50"):
        table.add_column(name, justify="left" if name == "value" else "right")
    for row in doc["rows"]:
        table.add_row(
            Text(str(row["value"])),
            Text(f"{row['requests']:,}"),
            Text(_pct(row["shown_share"])),
            Text(_pct(row["accept_rate"])),
            Text(f"{row['accepted_chars']:,}"),
            Text(_ms(row["latency_ms"]["p50"])),
        )
    return table


def _tenant(storage: Storage, name: str | None) -> tuple[int, str]:
    """The tenant `--tenant` names, else the only one; exits with the reason otherwise (a
    report never creates a tenant)."""
    if name is not None:
        found = storage.tenant_id(name)
        if found is None:
            raise SystemExit(f"tabloop stats: no tenant {name!r}")
        return found, name
    ids = tenant_ids(storage)
    if len(ids) != 1:
        raise SystemExit(
            f"tabloop stats: {len(ids)} tenants in the database: name one with --tenant"
        )
    return ids[0], dict(storage.tenants())[ids[0]]


def _open(url: str) -> Storage:
    """The backend's database at `url`; exits with the reason when there is none there (a
    report never creates a database, nor the directory of one) or the URL names no database."""
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = Path(parsed.database or "").expanduser()
            if not parsed.database or parsed.database == ":memory:" or not path.is_file():
                raise SystemExit(f"tabloop stats: no database at {path} (give one with --db)")
        return Storage(url)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise SystemExit(f"tabloop stats: not a database URL ({exc})") from None
    except SQLAlchemyError as exc:
        raise SystemExit(f"tabloop stats: cannot open the database: {exc}") from None


def stats_main(argv: list[str]) -> int:
    """Entry point of `tabloop stats`."""
    parser = argparse.ArgumentParser(
        prog="tabloop stats", description="the loop's figures of a tenant over a window"
    )
    parser.add_argument("--db", default=None, help=f"database URL (default: {default_db_url()})")
    parser.add_argument("--tenant", default=None, help="tenant name (default: the only one)")
    parser.add_argument("--window", default="24h", choices=list(WINDOWS))
    parser.add_argument(
        "--by", choices=list(DIMENSIONS), help="also split the figures by this dimension"
    )
    parser.add_argument("--json", action="store_true", help="print the overview as JSON")
    args = parser.parse_args(argv)
    storage = _open(args.db or default_db_url())
    try:
        tenant_id, name = _tenant(storage, args.tenant)
        stats = StatsService(storage, PolicyRegistry(storage), StatsRollup(storage))
        doc = {"tenant": name, **stats.overview(tenant_id, args.window)}
        if args.by:
            doc["split"] = {"tenant": name, **stats.split(tenant_id, args.window, args.by)}
    except SQLAlchemyError as exc:
        raise SystemExit(f"tabloop stats: cannot read the database: {exc}") from None
    finally:
        storage.close()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        console = Console()
        console.print(overview_table(doc))
        if "split" in doc:
            console.print(split_table(doc["split"]))
        if doc["empty"]:
            console.print(Text(f"no events in the last {args.window}"))
    return 0


if __name__ == "__main__":
    sys.exit(stats_main(sys.argv[1:]))
