"""/ws/me/'s lease_metrics (docs/FEED_PROTOCOL.md, docs/TELEMETRY.md): a heartbeat's GPU
readings of a lease reach its buyer, never its provider or another buyer; and the pages:
the buyer's leases page marks the lease for its chart and idle state, the provider's
pages show neither (its node page keeps the GPU counters)."""

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, override_settings
from django.utils import timezone

from marketplace import api_tokens, book, leases, telemetry
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"


def _running():
    provider, node, _ = registered_node()
    buyer, other = funded_buyer(100), funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_490_000, gpus=2,
                             duration_seconds=3600).leases
    lease = leases.mark_running(lease=lease, container_id="c" * 64)
    return provider, node, buyer, other, lease


def _reading(uuid, util):
    return {"uuid": uuid, "utilization_pct": util, "fb_used_mib": 4096, "power_w": 250.0,
            "temperature_c": 60, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
            "throttle_reasons": ["sw_power_cap"]}


def test_lease_metrics_go_to_the_buyer_only():
    provider, node, buyer, other, lease = _running()
    uuids = leases.gpu_uuids(lease)
    paths = {u: f"/ws/me/?ticket={api_tokens.issue_ticket(user=u)[0]}"
             for u in (buyer, other, provider)}

    async def scenario():
        comms = {}
        for user, path in paths.items():
            comm, connected, _ = await connect(path)
            assert connected
            assert (await recv(comm))["type"] == "snapshot"
            comms[user] = comm
        kept, errors = await call(telemetry.record, node=node, items=[
            {"lease": lease.pk, "gpus": [_reading(uuids[0], 42), _reading(uuids[1], 7)]}])
        assert (kept, errors) == (2, [])
        frames = {user: await drain(comm, timeout=0.8) for user, comm in comms.items()}
        for comm in comms.values():
            await comm.disconnect()
        return frames

    frames = async_to_sync(scenario)()
    mine = [json.loads(f) for f in frames[buyer]]
    [message] = [m for m in mine if m["type"] == "lease_metrics"]
    assert message["lease"] == lease.pk
    assert [(g["uuid"], g["utilization_pct"], g["throttle_reasons"]) for g in message["gpus"]] \
        == [(uuids[0], 42.0, ["sw_power_cap"]), (uuids[1], 7.0, ["sw_power_cap"])]
    assert message["idle"]["idle"] is False
    for user in (provider, other):
        assert not [f for f in frames[user] if "lease_metrics" in f or uuids[0] in f]


@override_settings(GPUMARKET_IDLE_UTILIZATION_PCT=5, GPUMARKET_IDLE_AFTER_SECONDS=60)
def test_the_buyers_page_shows_idle_and_the_providers_pages_do_not():
    provider, node, buyer, _, lease = _running()
    uuids = leases.gpu_uuids(lease)
    start = timezone.now() - timedelta(minutes=3)
    for step in range(18):
        telemetry.record(node=node, now=start + timedelta(seconds=10 * step), items=[
            {"lease": lease.pk, "gpus": [_reading(u, 0) for u in uuids]}])
    client = Client()
    client.force_login(buyer)
    page = client.get("/leases/").content.decode()
    assert f'data-metrics-lease="{lease.pk}"' in page
    assert "idle: 0 % for " in page and "paying $4.98/h" in page
    client.force_login(provider)
    for path in ("/provider/", f"/provider/nodes/{node.pk}/"):
        answer = client.get(path)
        assert answer.status_code == 200, path
        text = answer.content.decode()
        assert "data-metrics-lease" not in text and "idle:" not in text, path
    assert client.get(f"/api/v1/leases/{lease.pk}/metrics/").status_code == 404
    assert client.get(f"/api/v1/leases/{lease.pk}/").json()["idle"] is None
