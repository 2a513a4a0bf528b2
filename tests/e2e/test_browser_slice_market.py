"""Real browser (Chromium, Playwright) on a MIG slice market over ASGI: the page says what
the slice is, its live feed connects through the dotted slug, and the parent's page links
its slice markets (docs/CATALOG.md)."""

from __future__ import annotations

import pytest

from tests.e2e.test_browser_flows import asgi_server, browser  # noqa: F401 (fixtures)
from tests.factories import ensure_catalog

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SLICE = "h100-sxm-80gb.1g.10gb"


def test_a_slice_market_page_says_what_the_slice_is_and_goes_live(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    ensure_catalog()
    page = browser.page
    page.goto(f"{asgi_server}/markets/{SLICE}/")
    expect(page.locator("#slice")).to_contain_text("MIG slice: 1/7 of an H100: 10 GB, 16 SMs")
    expect(page.locator("#live-status")).to_have_text("live")  # /ws/markets/<slice>/ open
    browser.shot("browser-slice-market")
    page.locator("#slice a").click()  # to the whole GPU's market
    page.wait_for_url(f"{asgi_server}/markets/h100-sxm-80gb/")
    expect(page.locator("#slice-markets li")).to_have_count(6)
    page.locator("#slice-markets a", has_text="3g.40gb").click()
    page.wait_for_url(f"{asgi_server}/markets/h100-sxm-80gb.3g.40gb/")
    expect(page.locator("#slice")).to_contain_text("3/7 of an H100: 40 GB, 60 SMs")
    assert browser.errors == []
