"""The live feed in Chromium over the real ASGI application (uvicorn in a thread):

- the embedded default (no REDIS_URL: the channel layer on a SQLite file,
  core/sqlite_layer.py) carries a change a real Celery worker makes in another process
  (the auction close of its beat) to the open auction page and to /auctions/;
- the home page's market table follows /ws/summary/;
- after a form error the page keeps its GET URL and stays live, and #live-status says
  "reconnecting…" / "offline" when a refresh fails or the browser is offline.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.conftest import ROOT
from tests.e2e.test_browser_flows import ARTIFACTS, MARKET, browser  # noqa: F401 (fixture)
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.processes import child_env
from tests.support.servers import AsgiServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOSTS = ["127.0.0.1", "localhost", "testserver"]


def _reset_layers() -> None:
    from channels.layers import channel_layers

    from frontend import feed

    feed.flush()
    channel_layers.backends.clear()


@pytest.fixture
def embedded_default(settings, transactional_db, tmp_path):
    """`make demo`'s live feed: no REDIS_URL, the channel layer on var/channels.sqlite3,
    shared by this process's web server and a real Celery worker with beat on the
    filesystem broker, started without REDIS_URL (as marketplace/demo.py starts it)."""
    var = tmp_path / "var"
    var.mkdir()
    _reset_layers()
    settings.REDIS_URL = ""
    settings.ALLOWED_HOSTS = HOSTS
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "core.sqlite_layer.SQLiteChannelLayer",
                                           "CONFIG": {"path": str(var / "channels.sqlite3")}}}
    env = child_env(GPUMARKET_VAR_DIR=str(var))
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    log = open(var / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--beat", "--pool",
         "solo", "--loglevel", "INFO", "-s", str(var / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until("the Celery worker to be ready",
                   lambda: "ready" in (var / "worker.log").read_text(), timeout=60)
        assert "filesystem" in (var / "worker.log").read_text()  # no server for the broker
        with AsgiServer() as server:
            yield server.url
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
        _reset_layers()


@pytest.fixture
def asgi_server(settings, transactional_db):
    settings.ALLOWED_HOSTS = HOSTS
    with AsgiServer() as server:
        yield server.url


def _credited(username: str, usd: int):
    from settlement import services as ledger

    me = get_user_model().objects.get(username=username)
    ledger.dev_credit(user_id=me.pk, amount=usd * 1_000_000)
    return me


def test_the_workers_auction_close_reaches_the_open_pages(embedded_default, browser):  # noqa: F811
    from playwright.sync_api import expect

    from marketplace import auctions
    from marketplace.models import Auction

    base = embedded_default
    provider, node, _ = registered_node()
    page = browser.page
    browser.signup(base, "closer")
    me = _credited("closer", 500)
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                reserve_price=2_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(seconds=15))
    auctions.place_sealed_bid(bidder_id=me.pk, auction_id=lot.pk, price=3_000_000)

    page.goto(f"{base}/auctions/{lot.pk}/")
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.get_by_role("button", name="Withdraw my bid")).to_be_visible()
    listing = page.context.new_page()
    listing.goto(f"{base}/auctions/")
    expect(listing.locator("#live-status")).to_have_text("live")
    row = listing.locator("#auction-list tbody tr").filter(
        has=listing.locator(f'a[href="/auctions/{lot.pk}/"]'))
    expect(row.locator("td").nth(6)).to_have_text("open")
    expect(row.locator("td").nth(7)).to_have_text("1")
    left = row.locator(".seconds-left")
    first = left.inner_text()
    listing.wait_for_timeout(1300)
    assert re.fullmatch(r"\d+ s", left.inner_text()) and left.inner_text() != first  # ticks
    marks = [p.evaluate("window.__noReload = Math.random()") for p in (page, listing)]

    # a bid from this process: the list counts it
    rival = funded_buyer(1000)
    auctions.place_sealed_bid(bidder_id=rival.pk, auction_id=lot.pk, price=2_500_000)
    expect(row.locator("td").nth(7)).to_have_text("2")
    expect(page.locator("#bid-count")).to_have_text("2")

    # nobody here closes it: the worker's beat does, in its own process, at closes_at
    expect(page.locator("#auction-status")).to_have_text("closed", timeout=45_000)
    assert Auction.objects.get(pk=lot.pk).status == Auction.Status.CLOSED
    expect(page.locator("#clearing-price")).to_have_text("$2.50 /GPU-h")  # second price
    expect(page.locator("#my-bid")).to_contain_text("won")
    expect(page.get_by_role("button", name="Withdraw my bid")).to_have_count(0)
    expect(page.get_by_text("Replace my bid")).to_have_count(0)
    expect(row.locator("td").nth(6)).to_have_text("closed")
    expect(row.locator(".seconds-left")).to_have_count(0)
    expect(row.locator("td").nth(9)).to_contain_text("2.5")
    assert [p.evaluate("window.__noReload") for p in (page, listing)] == marks
    browser.shot("browser-embedded-auction-closed-by-worker")
    listing.screenshot(path=str(ARTIFACTS / "browser-embedded-auctions-list.png"))
    assert browser.errors == []


def test_the_home_market_table_follows_the_feed(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    from marketplace import book

    provider, node, _ = registered_node()
    page = browser.page
    page.goto(f"{asgi_server}/")
    expect(page.locator("#live-status")).to_have_text("live")
    row = page.locator("#home-markets tbody tr").filter(
        has=page.locator(f'a[href="/markets/{MARKET}/"]'))
    expect(row.locator("td").nth(6)).to_have_text("0")
    marker = page.evaluate("window.__noReload = Math.random()")

    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=3, available_until=in_a_day())
    expect(row.locator("td").nth(6)).to_have_text("3")
    expect(row.locator("td").nth(5)).to_contain_text("2.0")
    buyer = funded_buyer(1000)
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_500_000, gpus=1,
                   duration_seconds=3600)
    expect(row.locator("td").nth(4)).to_contain_text("1.5")
    assert page.evaluate("window.__noReload") == marker
    expect(page.locator("#live-status")).to_have_text("live")
    browser.shot("browser-home-live")
    assert browser.errors == []


def test_a_form_error_keeps_the_page_live_and_the_dot_truthful(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    from marketplace import book

    page = browser.page
    browser.signup(asgi_server, "formprov")
    me = get_user_model().objects.get(username="formprov")
    provider, node, _ = registered_node(user=me)
    page.goto(f"{asgi_server}/provider/")
    expect(page.locator("#live-status")).to_have_text("live")

    page.get_by_label("GPUs offered").fill("2")
    page.get_by_label("Ask price (USD per GPU-hour)").fill("two dollars")
    page.get_by_role("button", name="Place ask").click()
    expect(page.locator("#id_price_error")).to_be_visible()  # the error, next to its field
    # not the POST-only /provider/asks/ (live.js replaces it once the page's script runs)
    expect(page).to_have_url(f"{asgi_server}/provider/")
    assert page.get_by_label("GPUs offered").input_value() == "2"  # values kept
    assert page.get_by_label("Ask price (USD per GPU-hour)").input_value() == "two dollars"
    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))

    # a change elsewhere: the page's parts are fetched again, from /provider/
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_100_000, gpus=1, available_until=in_a_day())
    expect(page.locator("#my-orders")).to_contain_text("2.1")

    # the page cannot be fetched: the dot says so (and goes back once it can)
    page.route(f"{asgi_server}/provider/", lambda route: route.fulfill(status=503, body="down"))
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_200_000, gpus=1, available_until=in_a_day())
    expect(page.locator("#live-status")).to_have_text("reconnecting…")
    expect(page.locator("#live-status")).not_to_have_class(re.compile(r"\bon\b"))
    browser.shot("browser-live-status-reconnecting")
    page.unroute(f"{asgi_server}/provider/")
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_300_000, gpus=1, available_until=in_a_day())
    expect(page.locator("#my-orders")).to_contain_text("2.3")
    expect(page.locator("#live-status")).to_have_text("live")

    page.context.set_offline(True)
    expect(page.locator("#live-status")).to_have_text("offline")
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\boff\b"))
    page.context.set_offline(False)
    # logged by Chromium as failed resource loads: the form's answer (400) and the 503
    assert [e for e in browser.errors
            if "status of 503" not in e and "status of 400" not in e] == []
    assert not any("405" in e for e in browser.errors)


def test_the_dot_follows_the_server_going_away_and_back(settings, transactional_db,
                                                        browser):  # noqa: F811
    from playwright.sync_api import expect

    settings.ALLOWED_HOSTS = HOSTS
    server = AsgiServer().start()
    try:
        page = browser.page
        browser.signup(server.url, "dotwatcher")
        page.goto(f"{server.url}/orders/")
        status = page.locator("#live-status")
        expect(status).to_have_text("live")
        server.stop()  # the websocket closes; the page polls, and every poll fails
        expect(status).to_have_text("reconnecting…")
        expect(status).not_to_have_class(re.compile(r"\bon\b"))
        expect(status).to_have_text("offline", timeout=30_000)  # three failures in a row
        expect(status).to_have_class(re.compile(r"\boff\b"))
        server.start()  # the same port: the websocket reconnects
        expect(status).to_have_text("live", timeout=90_000)
        expect(status).to_have_class(re.compile(r"\bon\b"))
    finally:
        page.goto("about:blank")
        server.stop()
        from django.db import connections

        connections.close_all()
    # what the browser logged while the server was away: failed loads and socket errors
    assert not [e for e in browser.errors if "ERR_CONNECTION_REFUSED" not in e
                and "WebSocket" not in e and "Failed to load resource" not in e]
