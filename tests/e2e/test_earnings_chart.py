"""The provider's earnings chart in Chromium: a time axis (UTC labels, not one category
per lease) and bars that never overlap, one per period, however close settlements are."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from marketplace import book, lease_end, leases
from marketplace.models import Lease
from tests.e2e.test_browser_flows import MARKET
from tests.e2e.test_phone_layout import SHOTS, phone  # noqa: F401 (fixture)
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_earnings_on_a_time_axis_without_overlapping_bars(live_server, phone):  # noqa: F811
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    now = timezone.now()
    # two settlements 10 s apart about two hours ago, one now: two 5-minute periods (the
    # chart's periods start at multiples of 5 minutes since the epoch: the close two are put
    # a minute into one, so that no period boundary falls between them)
    early = now - timedelta(hours=2)
    early -= timedelta(seconds=early.timestamp() % 300 - 60)
    for settled in (early, early + timedelta(seconds=10), now):
        lease = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_000_000,
                               gpus=1, duration_seconds=3600).leases[0]
        leases.mark_running(lease=lease, container_id=f"c{lease.pk}")
        lease_end.end_lease(lease_id=lease.pk, status="completed", cause="time is up",
                            now=timezone.now() + timedelta(seconds=900))
        Lease.objects.filter(pk=lease.pk).update(settled_at=settled)

    client = Client()
    client.force_login(type(provider).objects.get(pk=provider.pk))
    context = phone.new_context(viewport={"width": 1000, "height": 800})
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                          "url": live_server.url}])
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.url}/provider/earnings/")
    page.wait_for_function("window.Chart && Chart.getChart('earnings-chart')")
    chart = page.evaluate("""() => {
      const c = Chart.getChart('earnings-chart');
      const bars = c.getDatasetMeta(1).data.map(b => [b.x - b.width / 2, b.x + b.width / 2]);
      return {type: c.scales.x.type, labels: c.scales.x.ticks.map(t => t.label),
              bars: bars, period: c.canvas.dataset.period,
              periodPx: c.scales.x.getPixelForValue(c.scales.x.min + 300000) -
                c.scales.x.getPixelForValue(c.scales.x.min),
              line: c.getDatasetMeta(0).data.length};
    }""")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "provider-earnings-chart.png"), full_page=True)
    context.close()
    assert errors == []
    assert chart["type"] == "linear" and chart["period"] == str(5 * 60_000)
    assert chart["labels"] and all(re.fullmatch(r"\d\d-\d\d \d\d:\d\d", x)
                                   for x in chart["labels"]), chart["labels"]
    assert chart["line"] == 3 and len(chart["bars"]) == 2  # the close two share one bar
    (a0, a1), (b0, b1) = sorted(chart["bars"])
    assert a0 < a1 <= b0 < b1  # side by side, never overlapping
    assert 0 < a1 - a0 <= chart["periodPx"] + 0.5  # a bar spans its period, no more
