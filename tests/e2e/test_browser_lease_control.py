"""The leases page's Stop in a real browser (headless Chromium, Playwright, the live
server): the cost so far and the time left count on by themselves (leases.js, under the
page's Content-Security-Policy, no JavaScript error), Stop… leads to the confirmation, the
confirmation stops the lease and the page shows the exact charge."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace import leases
from marketplace.models import Lease
from settlement import services as ledger
from tests.e2e.test_browser_flows import browser  # noqa: F401 (fixture)
from tests.factories import ask, bid, registered_node
from tests.support.servers import SeenRequests
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_cost_counts_live_and_stop_shows_the_exact_charge(live_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    page = browser.page
    browser.signup(live_server.url, "stopper")
    buyer = get_user_model().objects.get(username="stopper")
    ledger.dev_credit(user_id=buyer.pk, amount=50_000_000)
    provider, node, _ = registered_node()
    ask(provider, node, price=3600)  # 1 micro-USD per GPU-second
    [lease] = bid(buyer, price=3600, gpus=1).leases
    leases.mark_running(lease=lease, container_id="c" * 64,
                        now=timezone.now() - timedelta(seconds=120))

    page.goto(f"{live_server.url}/leases/")
    cost = page.locator("[data-live-cost]")
    first = cost.inner_text()
    assert re.fullmatch(r"\$0\.000\d{1,3} so far", first), first  # 120-odd micro-USD
    wait_until("the cost to count on", lambda: cost.inner_text() != first, timeout=10)
    left = page.locator("[data-live-left]").inner_text()
    assert re.fullmatch(r"0:5[78]:\d\d", left), left  # the server renders it so too
    # the page's periodic refresh (no websocket on this server) keeps the table when only
    # the counted cells differ: a property set on it survives two refreshes
    page.evaluate("document.querySelector('#my-leases table').keep = 1")
    with SeenRequests("/leases/") as refreshes:
        wait_until("two refreshes of the page", lambda: refreshes.count >= 2, timeout=20)
    assert page.evaluate("document.querySelector('#my-leases table').keep") == 1

    page.get_by_role("link", name="Stop…").click()
    expect(page.get_by_text("Charged if stopped now")).to_be_visible()
    page.get_by_role("button", name=f"Stop lease #{lease.pk} now").click()
    page.wait_for_url(re.compile(r"/leases/$"))
    ended = Lease.objects.get(pk=lease.pk)
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    assert ended.status == "cancelled" and ended.cost == seconds  # 1 micro-USD a second
    message = f"Lease #{lease.pk} stopped: charged 0.{seconds:06d}".rstrip("0")
    expect(page.get_by_text(message)).to_be_visible()
    assert page.locator("[data-live-cost]").count() == 0  # ended: the final figures only
    browser.shot("lease-stopped")
    assert browser.errors == []
