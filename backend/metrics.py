"""Counters of the backend, served at `/metrics` in the Prometheus text format.

`/metrics` is open, as Prometheus scrapers expect, so counters name no tenant unless the operator
asks for it (`Metrics(tenant_labels=True)`, `tabloop backend --metrics-tenant-labels`): a tenant's
name is the callers' business, and its traffic figures are too.
"""

from __future__ import annotations

import threading
from collections import defaultdict

HELP = {
    "tabloop_events_ingested_total": "Events stored for the first time, by type.",
    "tabloop_events_duplicate_total": "Events received again and not stored twice.",
    "tabloop_events_rejected_total": "Events or batches refused, by reason.",
    "tabloop_ingest_requests_total": "POST /v1/events requests, by HTTP status.",
    "tabloop_requests_unauthorized_total": "Requests without a valid bearer token.",
    "tabloop_adapter_tenants_total": "Tenants checked by an adapter training pass, by result "
    "(due, resume, skipped_no_text, skipped_too_few).",
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


class Metrics:
    """Thread-safe counters with labels; the `tenant` label only when `tenant_labels`."""

    def __init__(self, *, tenant_labels: bool = False) -> None:
        self.tenant_labels = tenant_labels
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        for name in HELP:
            self._values[name]  # every family appears, even at zero

    def inc(
        self, name: str, amount: float = 1.0, *, tenant: str | None = None, **labels: str
    ) -> None:
        """Add `amount` to counter `name` with `labels`, and `tenant` when tenants are named."""
        if tenant is not None and self.tenant_labels:
            labels["tenant"] = tenant
        key = tuple(sorted(labels.items()))
        with self._lock:
            family = self._values[name]
            family[key] = family.get(key, 0.0) + amount

    def value(self, name: str, **labels: str) -> float:
        """The current value (0 when never counted)."""
        with self._lock:
            return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        """The exposition text."""
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._values):
                lines.append(f"# HELP {name} {HELP.get(name, name)}")
                lines.append(f"# TYPE {name} counter")
                family = self._values[name]
                if not family:
                    lines.append(f"{name} 0")
                for labels, value in sorted(family.items()):
                    rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    label_text = "{" + rendered + "}" if rendered else ""
                    lines.append(f"{name}{label_text} {_number(value)}")
        return "\n".join(lines) + "\n"
