"""A running lease on the leases page in a real browser (headless Chromium, the live
server, its periodic refresh standing in for the feed): a pending lease shows Stop and
Extend and "… s once running"; once the runner reports it running, without a reload, its
time left and cost so far count on by themselves (leases.js: price × GPUs × seconds //
3600, from started_at and ends_at); an extension made elsewhere (the API, the CLI)
corrects the time left at the next update, and the cost keeps its per-second rate; its
Stop and Extend stay in view (under its status, not past the table's right edge)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace import lease_control, leases
from settlement import services as ledger
from tests.e2e.test_browser_flows import browser  # noqa: F401 (fixture)
from tests.factories import ask, bid, registered_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
CLOCK = re.compile(r"(\d+):(\d\d):(\d\d)")


def _seconds(text: str) -> int:
    h, m, s = (int(x) for x in CLOCK.fullmatch(text).groups())
    return h * 3600 + m * 60 + s


def _micros(text: str) -> int:
    text = text.removesuffix(" so far").removeprefix("$")  # "$0.000062 so far"
    whole, frac = text.split(".") if "." in text else (text, "")
    return int(whole) * 1_000_000 + int(frac.ljust(6, "0"))


def test_time_left_and_cost_count_live_and_follow_an_extension(live_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    page = browser.page
    browser.signup(live_server.url, "runner-watcher")
    buyer = get_user_model().objects.get(username="runner-watcher")
    ledger.dev_credit(user_id=buyer.pk, amount=50_000_000)
    provider, node, _ = registered_node()
    ask(provider, node, price=3600, gpus=2)  # 1 micro-USD per GPU-second
    [lease] = bid(buyer, price=3600, gpus=2).leases

    page.goto(f"{live_server.url}/leases/")
    row = page.locator(f"#lease-{lease.pk}")
    expect(row.locator("[data-live-left]")).to_have_text("3600 s once running")
    expect(row.get_by_role("link", name="Stop…")).to_be_visible()
    expect(row.get_by_role("link", name="Extend…")).to_be_visible()
    marker = page.evaluate("window.__noReload = Math.random()")

    # the runner reports it running 30 s ago: the page follows without a reload
    leases.mark_running(lease=lease, container_id="c" * 64,
                        now=timezone.now() - timedelta(seconds=30))
    left = row.locator("[data-live-left]")
    cost = row.locator("[data-live-cost]")
    wait_until("the time left to show", lambda: CLOCK.fullmatch(left.inner_text()),
               timeout=15)
    first_left, first_cost = _seconds(left.inner_text()), _micros(cost.inner_text())
    assert 3500 < first_left <= 3570, first_left
    assert 60 <= first_cost < 200, first_cost  # 2 GPUs × 30-odd s × 1 micro-USD
    wait_until("the clock to count down", lambda: _seconds(left.inner_text()) < first_left,
               timeout=10)
    wait_until("the cost to count up", lambda: _micros(cost.inner_text()) > first_cost,
               timeout=10)
    later = _micros(cost.inner_text())
    assert first_cost % 2 == 0 and later % 2 == 0  # 2 GPUs × 1 micro-USD × whole seconds

    # extended by an hour elsewhere: the time left jumps by an hour at the next update
    lease_control.extend_lease(buyer_id=buyer.pk, lease_id=lease.pk, seconds=3600)
    wait_until("the extension to show", lambda: _seconds(left.inner_text()) > 3600 + 3400,
               timeout=15)
    assert _seconds(left.inner_text()) <= 7200 - 30
    assert _micros(cost.inner_text()) >= later  # the cost so far goes on, never back
    assert page.evaluate("window.__noReload") == marker
    # the running row's buttons are in view, not behind the table's sideways scroll
    for name in ("Stop…", "Extend…"):
        box = row.get_by_role("link", name=name).bounding_box()
        assert box and box["x"] + box["width"] <= page.viewport_size["width"], (name, box)
    browser.shot("lease-running-extended")
    assert browser.errors == []
