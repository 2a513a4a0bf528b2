"""Per-lease telemetry end to end: a real runner process (`--simulate`, Docker, its GPU's
utilisation replayed) heartbeats the running lease's readings to the real ASGI marketplace,
and the buyer's leases page in Chromium charts them, extended live by /ws/me/'s
lease_metrics messages (no reload, no polling); the series API agrees."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from marketplace import book
from marketplace.models import Lease
from settlement import services as ledger
from tests.conftest import DATA
from tests.e2e.test_browser_flows import asgi_server, browser  # noqa: F401 (fixtures)
from tests.factories import in_a_day, registered_node
from tests.support.api import client_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]
TITAN_DUMP = DATA / "nvidia-smi" / "titan-v-x1.driver-560.35.03.txt"
MARKET = "titan-v"

UTIL_CHART = "Chart.getChart(document.querySelector('#lease-chart-%d canvas[data-chart=util]'))"


def test_a_running_lease_charts_its_gpu_live_from_the_runners_heartbeats(
        asgi_server, browser, runner_factory, test_image):  # noqa: F811
    from playwright.sync_api import expect

    provider, node, token = registered_node(TITAN_DUMP, name="titan-telemetry")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(asgi_server, token, TITAN_DUMP)
    assert runner.register().returncode == 0, runner.output()
    [uuid] = node.gpus.values_list("uuid", flat=True)
    runner.start(extra=("--heartbeat-interval", "1", "--replay-health",
                        json.dumps({uuid: {"utilization_pct": 37, "fb_used_mib": 2048}})))

    page = browser.page
    browser.signup(asgi_server, "chartbuyer")
    buyer = get_user_model().objects.get(username="chartbuyer")
    ledger.dev_credit(user_id=buyer.pk, amount=20_000_000)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_400_000, gpus=1, available_until=in_a_day())
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_400_000, gpus=1,
                   duration_seconds=3600, image=test_image, command=["sleep", "3600"])
    lease = Lease.objects.get(buyer=buyer)

    page.goto(f"{asgi_server}/leases/")
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("""window.__metrics = [];
        GM.meListeners.push(function (m) {
            if (m.type === 'lease_metrics') window.__metrics.push(m); });
        window.__noReload = 1""")
    # the runner starts it; the table follows over /ws/me/ and a chart box appears
    expect(page.locator(f"#lease-{lease.pk}")).to_contain_text("running", timeout=60_000)
    expect(page.locator(f"#lease-chart-{lease.pk}")).to_be_visible()
    wait_until("two lease_metrics messages of the lease", lambda: len(
        [m for m in page.evaluate("window.__metrics") if m["lease"] == lease.pk]) >= 2,
        timeout=30)
    last = page.evaluate("window.__metrics[window.__metrics.length - 1]")
    assert [g["uuid"] for g in last["gpus"]] == [uuid]
    assert last["gpus"][0]["utilization_pct"] == 37.0
    assert last["gpus"][0]["fb_used_mib"] == 2048.0
    chart = page.evaluate(f"""(function () {{ var c = {UTIL_CHART % lease.pk};
        return {{labels: c.data.labels, data: c.data.datasets.map(function (d) {{
            return {{label: d.label, data: d.data}}; }})}}; }})()""")
    assert chart["labels"][-1] == last["at"][11:19]  # the live bucket is the newest point
    assert chart["data"][0]["label"] == uuid[:12] + "…"
    assert chart["data"][0]["data"][-1] == 37.0
    expect(page.locator(f"#lease-chart-{lease.pk} [data-latest]")).to_contain_text(
        "throttle: none")
    assert page.evaluate("window.__noReload") == 1

    body = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/").json()
    [gpu] = body["gpus"]
    assert gpu["uuid"] == uuid and set(gpu["utilization_pct"]) == {37.0}
    assert "telemetry refused" not in runner.output()
    browser.shot("lease-telemetry-chart")
    assert browser.errors == []
