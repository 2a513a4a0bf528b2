"""Every page at a phone's 390 × 844 viewport in Debian's Chromium: nothing scrolls
sideways (`document.documentElement.scrollWidth <= 390`), logged out, as a buyer and as
a provider, with long names on the page; the header's links fold into a menu that opens.
Each page's screenshot is saved under var/screenshots/ (git-ignored) for a person to
look at."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from marketplace import auctions, book, lease_end, leases
from tests.conftest import ROOT, require_or_skip
from tests.e2e.test_browser_flows import ARGS, CHROMIUM, MARKET
from tests.factories import funded_buyer, in_a_day, registered_node

SHOTS = ROOT / "var" / "screenshots"
WIDTH, HEIGHT = 390, 844
LONG = "a-very-long-node-name-for-the-h100-box-in-rack-42-of-the-second-hall"

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _scene():
    """A provider (a long node name) with an ask, an open sealed auction, a settled
    lease; a buyer with a resting bid, that lease and wallet history."""
    provider, node, _ = registered_node(name=LONG)
    buyer = funded_buyer(100)
    buyer.username = "buyerwithaverylongusernamethatnobrowsercanbreakanywhere1234567890"
    buyer.save(update_fields=["username"])
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_865_000, gpus=4, available_until=in_a_day())
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_865_000, gpus=1,
                            duration_seconds=3600)
    lease = placed.leases[0]
    leases.mark_running(lease=lease, container_id="c0ffee")
    lease_end.end_lease(lease_id=lease.pk, status="completed", cause="time is up",
                        now=timezone.now() + timedelta(seconds=600))
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_234_567, gpus=2,
                   duration_seconds=7200)
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_500_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(hours=1),
                                rule="uniform_price")
    return provider, node, buyer, lot


def _session_cookie(user, base: str) -> dict:
    client = Client()
    client.force_login(type(user).objects.get(pk=user.pk))
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base}


@pytest.fixture
def phone(monkeypatch):
    if not Path(CHROMIUM).exists():
        require_or_skip("chromium not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        require_or_skip("playwright not installed (the `test` extra)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            connections.close_all()


def test_no_page_scrolls_sideways_at_390_px(live_server, phone):
    provider, node, buyer, lot = _scene()
    base = live_server.url
    pages = {
        "home": "/", "market": f"/markets/{MARKET}/", "auctions": "/auctions/",
        "auction": f"/auctions/{lot.pk}/",
    }
    visits = [("anonymous", None, {**pages, "login": "/login/", "signup": "/signup/"}),
              ("buyer", buyer, {**pages, "orders": "/orders/", "leases": "/leases/",
                                "wallet": "/wallet/", "wallet-history": "/wallet/history/"}),
              ("provider", provider, {"home": "/", "portal": "/provider/",
                                      "node": f"/provider/nodes/{node.pk}/",
                                      "earnings": "/provider/earnings/",
                                      "leases": "/leases/"})]
    SHOTS.mkdir(parents=True, exist_ok=True)
    too_wide, errors = {}, []
    for role, user, paths in visits:
        context = phone.new_context(viewport={"width": WIDTH, "height": HEIGHT},
                                    device_scale_factor=1, is_mobile=True, has_touch=True)
        context.set_default_timeout(15_000)
        if user is not None:
            context.add_cookies([_session_cookie(user, base)])
        page = context.new_page()
        page.on("pageerror", lambda exc, role=role: errors.append(f"{role}: {exc}"))
        for name, path in paths.items():
            r = page.goto(base + path)
            assert r.status == 200, (role, name, r.status)
            page.wait_for_load_state("load")
            width = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=str(SHOTS / f"{role}-{name}.png"), full_page=True)
            if width > WIDTH:
                too_wide[f"{role} {name}"] = width
        page.goto("about:blank")
        context.close()
    assert too_wide == {}, f"pages wider than {WIDTH} px: {too_wide}"
    assert errors == []
    assert (SHOTS / "provider-earnings.png").stat().st_size > 0


def test_small_screen_menu_opens_and_the_header_spans_the_page(live_server, phone):
    from playwright.sync_api import expect

    buyer = funded_buyer(1)
    context = phone.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    context.add_cookies([_session_cookie(buyer, live_server.url)])
    page = context.new_page()
    page.goto(live_server.url + "/")
    wallet = page.locator("#main-menu").get_by_role("link", name="Wallet", exact=True)
    expect(wallet).to_be_hidden()
    toggle = page.get_by_role("button", name="Menu")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(wallet).to_be_visible()
    header = page.locator("header.top").bounding_box()
    assert header["x"] == 0 and header["width"] == WIDTH
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    page.screenshot(path=str(SHOTS / "buyer-menu-open.png"))
    wallet.click()
    page.wait_for_url("**/wallet/")
    # a wide screen shows the links, no menu button
    page.set_viewport_size({"width": 1280, "height": 800})
    expect(page.get_by_role("button", name="Menu")).to_be_hidden()
    expect(page.locator("#main-menu").get_by_role("link", name="Wallet", exact=True)) \
        .to_be_visible()
    page.goto("about:blank")
    context.close()
