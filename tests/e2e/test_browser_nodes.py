"""The provider's node in a real browser (headless Chromium, Playwright, the live server):
the token page's "Copy token" puts the runner token on the clipboard (copy.js, under the
page's Content-Security-Policy); the node page renames the node, refuses to retire it
while a lease is active (saying which), then retires it once the lease ended: the node
leaves the portal's list, its runner gets 401."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from marketplace.lease_control import stop_lease
from providers.models import Node
from tests.e2e.test_browser_flows import browser  # noqa: F401 (fixture)
from tests.factories import ask, bid, ensure_catalog, funded_buyer, registered_node
from tests.support.api import runner_client

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_copy_rename_refused_retire_then_retire(live_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    ensure_catalog()
    page = browser.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                   origin=live_server.url)
    browser.signup(live_server.url, "noderunner")
    user = get_user_model().objects.get(username="noderunner")
    _, node, token = registered_node(user=user, name="box-1")

    # a second node through the page: its token page has the copy button
    page.goto(f"{live_server.url}/provider/")
    page.get_by_label("Node name").fill("box-2")
    page.get_by_role("button", name="Add node and show its runner token").click()
    shown = page.get_by_label("Runner token", exact=True).input_value()
    page.bring_to_front()  # the clipboard API writes only from a focused document
    page.get_by_role("button", name="Copy token").click()
    expect(page.locator("#copy-status")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == shown
    expect(page.locator("#simulate-hint")).to_contain_text("a10-x1.driver-535.129.03.txt")
    browser.shot("node-token-copied")
    # on a phone the token page and the node page scroll only downwards
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.goto(f"{live_server.url}/provider/nodes/{node.pk}/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    browser.shot("node-page-390")
    page.set_viewport_size({"width": 1280, "height": 900})

    # rename box-1 from its page
    page.goto(f"{live_server.url}/provider/nodes/{node.pk}/")
    page.get_by_label("New name").fill("rack-7")
    page.get_by_role("button", name="Rename").click()
    expect(page.get_by_role("heading", name="Node rack-7")).to_be_visible()
    assert Node.objects.get(pk=node.pk).name == "rack-7"

    # a lease on it: retiring is refused, with the lease named
    ask(user, node)
    buyer = funded_buyer()
    [lease] = bid(buyer, gpus=1).leases
    page.reload()
    page.get_by_label(re.compile("I understand: its asks are cancelled")).check()
    page.get_by_role("button", name="Retire node").click()
    page.wait_for_url(re.compile(rf"/provider/nodes/{node.pk}/$"))
    expect(page.get_by_text("was not retired")).to_contain_text(f"1 active lease (#{lease.pk})")
    assert Node.objects.get(pk=node.pk).retired_at is None
    browser.shot("node-retire-refused")

    expect(page.locator("#retire-refusal")).to_contain_text(f"#{lease.pk}")
    # the lease ends: the page stops saying why not (no reload), the node retires, and
    # the portal no longer lists it
    stop_lease(buyer_id=buyer.pk, lease_id=lease.pk)
    expect(page.locator("#retire-refusal")).to_have_count(0, timeout=15_000)
    page.get_by_label(re.compile("I understand: its asks are cancelled")).check()
    page.get_by_role("button", name="Retire node").click()
    page.wait_for_url(re.compile(r"/provider/$"))
    expect(page.get_by_text("Node “rack-7” retired; ask #")).to_be_visible()
    expect(page.locator("#retired-nodes")).to_contain_text("rack-7")
    expect(page.get_by_role("table").first).not_to_contain_text("rack-7")
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 401
    browser.shot("node-retired")
    assert browser.errors == []
