"""The dashboard in headless Chromium against the real backend seeded with a generated history
(several policy versions, a promotion, a rollback, two languages, two editors): what each page
renders equals the JSON endpoints, tenants stay apart, and the buttons change the registry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from backend.policy.registry import PolicyRegistry
from tests.support import dashboard_history
from tests.support.backend_server import BackendServer
from tests.support.browser import record_screenshot
from tests.support.dashboard_history import History

# Not the machine's zone (UTC here): times must follow the browser's zone, not the server's.
BROWSER_ZONE = "Asia/Kolkata"


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[tuple[BackendServer, History]]:
    with BackendServer(f"sqlite:///{tmp_path / 'backend.sqlite3'}") as server:
        history = dashboard_history.generate(server.storage, server.tenant_id)
        dashboard_history.post(server.url, server.token, history.events)
        yield server, history


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": 1280, "height": 900}, timezone_id=BROWSER_ZONE, locale="en-US"
    )
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == [], errors


def sign_in(page: Any, url: str, token: str, path: str = "/dashboard") -> None:
    """Open `path` on a fresh document, give the token, wait until a page is drawn."""
    page.goto(url + path)
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-ready=true][data-page]")


def wait_ready(page: Any, name: str | None = None) -> None:
    selector = "body[data-ready=true]" + (f"[data-page={name}]" if name else "")
    page.wait_for_selector(selector)


def open_page(page: Any, name: str) -> None:
    page.click(f"#nav a[data-page={name}]")
    wait_ready(page, name)


def card_values(page: Any) -> dict[str, str]:
    cards = page.locator("#summary .card")
    return {
        cards.nth(i).get_attribute("data-key"): cards.nth(i).get_attribute("data-value")
        for i in range(cards.count())
    }


def api(server: BackendServer, path: str, **params: str) -> Any:
    response = httpx.get(
        f"{server.url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()


def close(shown: str, value: float | int | None) -> bool:
    if value is None:
        return shown == ""
    return float(shown) == pytest.approx(value)


def test_every_page_shows_what_the_endpoints_say(
    seeded: tuple[BackendServer, History], page: Any, screenshots: Path
) -> None:
    server, _history = seeded
    sign_in(page, server.url, server.token)
    assert page.url.endswith("/dashboard/overview")

    # Overview: the cards are the endpoint's numbers; five charts with their series drawn.
    overview = api(server, "/v1/stats/overview", window="24h")
    summary = overview["summary"]
    cards = card_values(page)
    expected = {
        "requests": summary["requests"],
        "shown_share": summary["shown_share"],
        "accept_rate": summary["accept_rate"],
        "partial_rate": summary["partial_rate"],
        "accepted_chars": summary["accepted_chars"],
        "retained_600": summary["retained_chars"]["600"],
        "latency_p50": summary["latency_ms"]["p50"],
        "latency_p95": summary["latency_ms"]["p95"],
    }
    assert set(cards) == set(expected)
    for key, value in expected.items():
        assert close(cards[key], value), (key, cards[key], value)
    charts = page.locator("figure.chart")
    assert charts.count() == 5
    series = {}
    for i in range(charts.count()):
        chart = charts.nth(i)
        assert chart.locator("canvas").count() == 1
        # uPlot's legend: one row for time, then one per series.
        series[chart.get_attribute("data-chart")] = chart.locator(".u-legend .u-series").count() - 1
        assert chart.get_attribute("data-empty") is None
    assert series == {"requests": 1, "rates": 3, "chars": 4, "silences": 4, "latency": 2}
    page.screenshot(path=screenshots / "overview.png", full_page=True)
    record_screenshot(screenshots / "overview.png")

    # Policies: every version with its evaluation, the history with who acted, in local time.
    open_page(page, "policies")
    policies = api(server, "/v1/stats/policies")
    rows = page.locator("#versions tbody tr")
    assert [rows.nth(i).get_attribute("data-version") for i in range(rows.count())] == [
        v["version"] for v in reversed(policies["versions"])
    ]
    assert page.locator("#versions tr.serving").get_attribute("data-version") == "v1"
    history = page.locator("#history tbody tr")
    assert history.count() == 3
    first = policies["history"][0]
    assert history.nth(2).locator("td").nth(3).inner_text() == first["actor"] == "token:alice"
    local = datetime.fromisoformat(first["at"]).astimezone(ZoneInfo(BROWSER_ZONE))
    clock = f"{local.hour % 12 or 12}:{local.minute:02d}:{local.second:02d}"
    assert clock in history.nth(2).locator("td").nth(0).inner_text()
    page.screenshot(path=screenshots / "policies.png", full_page=True)
    record_screenshot(screenshots / "policies.png")

    # Ingestion and sync: the counts of batches and the reported spool.
    open_page(page, "ingestion")
    ingestion = api(server, "/v1/stats/ingestion", window="24h")
    cards = card_values(page)
    for key in ("batches", "accepted", "refused_batches", "duplicate_batches", "rate_limited"):
        assert close(cards[key], ingestion["totals"][key]), key
    assert ingestion["totals"]["batches"] == 4
    assert page.locator("#spools tbody tr").count() == len(ingestion["spools"]) == 1
    assert page.locator("figure.chart canvas").count() == 2
    page.screenshot(path=screenshots / "ingestion.png", full_page=True)
    record_screenshot(screenshots / "ingestion.png")

    # By language, editor and model version: a row and a series per value of each.
    open_page(page, "breakdown")
    for by, values in (
        ("language", {"python", "typescript"}),
        ("editor", {"vscode", "neovim"}),
        ("model", {"v0001", "v0002"}),
    ):
        split = api(server, f"/v1/stats/by/{by}", window="24h")
        section = page.locator(f"section[data-split={by}]")
        shown = {}
        table_rows = section.locator("table.split tbody tr")
        for i in range(table_rows.count()):
            row = table_rows.nth(i)
            requests = row.locator("td[data-key=requests]").inner_text().replace(",", "")
            shown[row.get_attribute("data-value")] = int(requests)
        assert shown == {r["value"]: r["requests"] for r in split["rows"]}
        assert set(shown) == values
        legend = section.locator("figure.chart .u-legend .u-series")
        assert legend.count() - 1 == len(values)
    page.screenshot(path=screenshots / "breakdown.png", full_page=True)
    record_screenshot(screenshots / "breakdown.png")


def test_the_buttons_promote_and_roll_back_with_confirmation(
    seeded: tuple[BackendServer, History], page: Any
) -> None:
    server, history = seeded
    token = server.storage.create_token(server.tenant, label="frank")
    registry = PolicyRegistry(server.storage)
    sign_in(page, server.url, token, "/dashboard/policies")
    v3 = history.versions[2]

    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click(f"#versions tr[data-version={v3}] button[data-action=promote]")
    assert registry.serving_version(server.tenant_id) == "v1"  # dismissed: nothing changed

    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#versions tr[data-version={v3}] button[data-action=promote]")
    page.wait_for_selector(f"#versions tr.serving[data-version={v3}]")
    assert registry.serving_version(server.tenant_id) == v3
    frank = registry.history(server.tenant_id)[-1]["actor"]
    assert frank.startswith("token:frank#")
    assert f"recorded as {frank}" in page.locator("#status").inner_text()

    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"#versions tr[data-version={v3}] button[data-action=rollback]")
    page.wait_for_selector("#versions tr.serving[data-version=v1]")
    assert registry.serving_version(server.tenant_id) == "v1"
    last = registry.history(server.tenant_id)[-1]
    assert (last["action"], last["actor"]) == ("rollback", frank)
    assert page.locator("#history tbody tr").first.locator("td").nth(3).inner_text() == frank


def test_a_tenant_token_cannot_open_another_tenants_pages(
    seeded: tuple[BackendServer, History], page: Any
) -> None:
    server, _history = seeded
    stranger = server.storage.create_token(f"other-{uuid.uuid4().hex[:6]}")
    for name in ("overview", "policies", "ingestion", "breakdown"):
        sign_in(page, server.url, stranger, f"/dashboard/{name}?tenant={server.tenant}")
        assert page.locator("#status").get_attribute("data-kind") == "error"
        assert "HTTP 403" in page.locator("#status").inner_text()
        assert page.locator("#summary .card, figure.chart, #versions").count() == 0
        page.click("#signout")
    # Its own tenant it sees, and only that one is offered.
    sign_in(page, server.url, stranger)
    options = page.locator("#tenant option")
    assert options.count() == 1 and options.first.inner_text().startswith("other-")


def test_an_admin_token_switches_between_tenants(
    seeded: tuple[BackendServer, History], page: Any
) -> None:
    server, _history = seeded
    admin = server.storage.create_token(f"ops-{uuid.uuid4().hex[:6]}", label="gia", admin=True)
    sign_in(page, server.url, admin)
    assert "(admin)" in page.locator("#who").inner_text()
    page.select_option("#tenant", server.tenant)
    page.wait_for_selector(f"#page h2:has-text('Overview of {server.tenant}')")
    wait_ready(page)
    requests = api(server, "/v1/stats/overview", window="24h")["summary"]["requests"]
    assert card_values(page)["requests"] == str(requests)
    assert f"tenant={server.tenant}" in page.url


def test_an_empty_tenant_shows_empty_states_not_blank_charts(
    tmp_path: Path, page: Any, screenshots: Path
) -> None:
    with BackendServer(f"sqlite:///{tmp_path / 'empty.sqlite3'}") as server:
        sign_in(page, server.url, server.token)
        assert page.locator("figure.chart").count() == 0
        assert "No events from" in page.locator(".empty-state").inner_text()
        assert card_values(page)["requests"] == "0"
        assert card_values(page)["accept_rate"] == ""  # no rate of nothing
        page.screenshot(path=screenshots / "overview-empty.png", full_page=True)
        record_screenshot(screenshots / "overview-empty.png")
        open_page(page, "policies")
        assert "No policy versions yet" in page.locator("#page").inner_text()
        open_page(page, "ingestion")
        assert page.locator(".empty-state").count() == 3
        open_page(page, "breakdown")
        assert page.locator("section .empty-state").count() == 3  # language, editor, model
        page.select_option("#window", "30d")
        wait_ready(page, "breakdown")
        assert "30 days" in page.locator("#page h2").inner_text()


def test_a_wrong_token_is_refused_at_sign_in(
    seeded: tuple[BackendServer, History], page: Any
) -> None:
    server, _history = seeded
    page.goto(server.url + "/dashboard")
    page.fill("#token", "tl_not-a-token")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login-error:has-text('not accepted')")
    assert page.locator("#login").is_visible()
    assert page.locator("#page").inner_text() == ""
