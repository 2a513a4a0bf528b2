"""Real browser (Debian Chromium, Playwright) on the market page: the depth chart's data
(bids cumulative at or above each price, asks at or below), the offers table sorted and
filtered through the page and kept live by the market feed, "Bid for this node", and the
price history chart's data."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.e2e.test_browser_flows import asgi_server, browser  # noqa: F401 (fixtures)
from tests.factories import H100, ask, bid, funded_buyer, registered_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _at(points: list[dict], x: float) -> float:
    """The height of the drawn line (straight segments between the points) at price x,
    a price between two corners (at a step's own price the line is vertical)."""
    for a, b in itertools.pairwise(points):
        if a["x"] < x < b["x"]:
            return a["y"] + (b["y"] - a["y"]) * (x - a["x"]) / (b["x"] - a["x"])
    raise AssertionError(f"{x} is outside the drawn line {points}")


def test_the_depth_chart_draws_bids_at_or_above_and_asks_at_or_below(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    provider, node, _ = registered_node()
    buyer = funded_buyer()
    bid(buyer, price=550_000, gpus=1)
    bid(buyer, price=500_000, gpus=2)
    ask(provider, node, price=600_000, gpus=1)
    ask(provider, node, price=700_000, gpus=2)
    page = browser.page
    page.goto(f"{asgi_server}/markets/{H100}/")
    expect(page.locator("#best-bid")).to_have_text("$0.55 /GPU-h")
    chart = page.evaluate("GM.depthChart")
    drawn = page.evaluate("(() => { const c = Chart.getChart('depth-chart');"
                          " return c.data.datasets.map(d => ({data: d.data,"
                          " stepped: d.stepped || false})); })()")
    assert [d["data"] for d in drawn] == [chart["bids"], chart["asks"]]
    assert not any(d["stepped"] for d in drawn)  # straight segments: _at reads them
    bids, asks = chart["bids"], chart["asks"]
    assert _at(bids, 0.525) == 1      # only the 0.55 bid pays 0.525 or more
    assert _at(bids, 0.499) == 3      # both below 0.50
    assert {"x": 0.5, "y": 3} in bids and {"x": 0.5, "y": 1} in bids  # the step at 0.50
    assert bids[-1] == {"x": 0.55, "y": 1}  # nothing bid above 0.55
    assert _at(asks, 0.65) == 1 and _at(asks, 0.701) == 3 and asks[0] == {"x": 0.6, "y": 1}
    browser.shot("browser-market-depth")
    assert browser.errors == []


def test_offers_sort_filter_live_and_bid_for_this_node(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    p1, n1, _ = registered_node(name="alpha", own_uuids=True)
    p2, n2, _ = registered_node(name="beta", own_uuids=True, cuda_version="12.4")
    n2.provider.display_name = "Bolt"
    n2.provider.save()
    ask(p1, n1, price=1_000_000, gpus=8)
    ask(p2, n2, price=2_000_000, gpus=4)
    page = browser.page
    browser.signup(asgi_server, "picker")  # the bid form is for members
    page.goto(f"{asgi_server}/markets/{H100}/")
    expect(page.locator("#live-status")).to_have_text("live")
    nodes = page.locator("#offer-rows td.offer-node")
    expect(nodes).to_have_text(["alpha", "beta"])

    page.locator('#offer-table th[data-sort="price"] a').click()  # price is on: reverse it
    expect(nodes).to_have_text(["beta", "alpha"])
    assert "sort=-price" in page.url
    page.get_by_label("At least GPUs free").fill("6")
    page.get_by_role("button", name="Filter").click()
    expect(nodes).to_have_text(["alpha"])
    page.get_by_label("At least GPUs free").fill("")
    page.get_by_label("CUDA at least").fill("12.3")
    page.get_by_role("button", name="Filter").click()
    expect(nodes).to_have_text(["beta"])
    page.get_by_label("CUDA at least").fill("twelve")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#offer-filter-error")).to_contain_text("min_cuda")
    # the page itself answered 400, which Chromium logs; nothing else may have
    assert browser.errors == ["console.error: Failed to load resource: the server responded "
                              "with a status of 400 (Bad Request)"]
    browser.errors.clear()

    page.goto(f"{asgi_server}/markets/{H100}/")
    expect(page.locator("#live-status")).to_have_text("live")
    marker = page.evaluate("window.__noReload = Math.random()")
    p3, n3, _ = registered_node(name="gamma", own_uuids=True)
    ask(p3, n3, price=1_500_000, gpus=2)  # made elsewhere: arrives through the feed
    expect(nodes).to_have_text(["alpha", "gamma", "beta"])
    assert page.evaluate("window.__noReload") == marker

    page.locator(f'#offer-rows tr[data-node="{n2.pk}"] a.bid-node').click()
    expect(page.locator("#id_node")).to_have_value(str(n2.pk))
    expect(page.locator("#id_price")).to_have_value("2.00")
    browser.shot("browser-market-offers")
    assert browser.errors == []


def test_the_price_history_chart_draws_the_fills(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    from marketplace.models import Fill

    provider, node, _ = registered_node()
    buyer = funded_buyer()
    minute = timezone.now().replace(second=0, microsecond=0)
    for price, at in ((2_000_000, minute - timedelta(minutes=40)),
                      (2_500_000, minute - timedelta(minutes=40, seconds=-30)),  # same minute
                      (2_200_000, minute - timedelta(minutes=10))):
        ask(provider, node, price=price, gpus=1)
        placed = bid(buyer, price=price, gpus=1)
        Fill.objects.filter(bid=placed.order).update(created_at=at)
    page = browser.page
    page.goto(f"{asgi_server}/markets/{H100}/?range=1h")
    expect(page.locator("#no-history")).to_be_hidden()
    h = page.evaluate("GM.historyChart")
    assert h["range"] == "1h" and len(h["buckets"]) == 60
    traded = [b for b in h["buckets"] if b["trades"]]
    assert [b["trades"] for b in traded] == [2, 1]
    assert [(b["open"], b["high"], b["low"], b["close"]) for b in traded] == [
        ("2.00", "2.50", "2.00", "2.50"), ("2.20", "2.20", "2.20", "2.20")]
    assert [r["y"] for r in h["ranges"]] == [[2.0, 2.5], [2.2, 2.2]]
    # the high–low bar is drawn from low to high on the price axis (pixels)
    bar, scale = page.evaluate("(() => { const c = Chart.getChart('history-chart');"
                               " const b = c.getDatasetMeta(0).data[0];"
                               " return [[b.base, b.y], [c.scales.y.getPixelForValue(2.0),"
                               " c.scales.y.getPixelForValue(2.5)]]; })()")
    assert bar == pytest.approx(scale, abs=1)
    browser.shot("browser-market-history")
    assert browser.errors == []


def test_the_market_page_with_offers_and_history_fits_a_phone(asgi_server, browser):  # noqa: F811
    from playwright.sync_api import expect

    p1, n1, _ = registered_node(name="a-node-with-a-rather-long-name-indeed", own_uuids=True)
    ask(p1, n1, price=1_000_000, gpus=8)
    page = browser.page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{asgi_server}/markets/{H100}/")
    expect(page.locator("#offer-rows tr")).to_have_count(1)
    width = page.evaluate("document.documentElement.scrollWidth")
    browser.shot("browser-market-phone")
    assert width <= 390
    assert browser.errors == []
