"""Buyer-visible container endpoints, marketplace side: a bid (or sealed bid) names the
container ports to expose; its lease carries them to the runner; the runner reports where
each is published with `running`; the buyer sees the endpoints in the lease API, on the
leases page and in /ws/me/ lease messages. Bad ports and bad endpoints are refused naming the
field, and change nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from frontend.feed import lease_payload, me_snapshot
from marketplace import auctions
from marketplace.models import Lease, Order, SealedBid
from tests.factories import ask, bid_body, funded_buyer, in_a_day, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db
H100 = "h100-sxm-80gb"
ENDPOINT = {"container_port": 8888, "host": "127.0.0.1", "host_port": 32768}


def _market():
    provider, node, token = registered_node()
    buyer = funded_buyer(100)
    ask(provider, node, price=2_000_000)
    return provider, node, token, buyer


def _post_bid(buyer, **changes):
    """POST /api/v1/orders/ of a 1-GPU H100 bid by `buyer` with `changes`."""
    return client_for(buyer).post("/api/v1/orders/", bid_body(**{"gpus": 1, **changes}),
                                  format="json")


def test_ports_travel_from_the_bid_to_the_runner_and_endpoints_back_to_the_buyer():
    _, _, token, buyer = _market()
    r = _post_bid(buyer, ports=[8888, 6006])
    assert r.status_code == 201, r.content
    assert r.json()["ports"] == [6006, 8888]
    (lease_id,) = r.json()["leases"]
    runner = runner_client(token)
    [listed] = runner.get("/api/v1/runner/leases/").json()["leases"]
    assert listed["ports"] == [6006, 8888]

    url = f"/api/v1/runner/leases/{lease_id}/events/"
    assert runner.post(url, {"status": "starting"}, format="json").status_code == 200
    r = runner.post(url, {"status": "running", "container_id": "c0ffee",
                          "endpoints": [ENDPOINT]}, format="json")
    assert r.status_code == 200, r.content
    lease = Lease.objects.get(pk=lease_id)
    assert lease.endpoints == [ENDPOINT] and lease.status == "running"

    body = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    assert body["ports"] == [6006, 8888]
    assert body["endpoints"] == [{**ENDPOINT, "address": "127.0.0.1:32768"}]
    # the live feed's lease message and /ws/me/ snapshot carry them too
    payload = lease_payload(lease, "buyer")
    assert payload["ports"] == [6006, 8888]
    assert payload["endpoints"] == [{**ENDPOINT, "address": "127.0.0.1:32768"}]
    [mine] = me_snapshot(buyer.pk)["leases"]
    assert mine["endpoints"][0]["address"] == "127.0.0.1:32768"

    # a repeated running report (runner restarted, container re-adopted) may update them
    moved = {**ENDPOINT, "host": "gpu1.example.net", "host_port": 40000}
    r = runner.post(url, {"status": "running", "container_id": "c0ffee",
                          "endpoints": [moved]}, format="json")
    assert r.status_code == 200
    assert Lease.objects.get(pk=lease_id).endpoints == [moved]


def test_the_leases_page_shows_where_to_connect(client):
    _, _, token, buyer = _market()
    (lease_id,) = _post_bid(buyer, ports=[8888]).json()["leases"]
    login(client, buyer)
    html = client.get(reverse("leases-page")).content.decode()
    assert "ports 8888: endpoint shown once running" in html
    url = f"/api/v1/runner/leases/{lease_id}/events/"
    runner_client(token).post(url, {"status": "running", "container_id": "c0ffee",
                                    "endpoints": [ENDPOINT]}, format="json")
    html = client.get(reverse("leases-page")).content.decode()
    assert "port 8888 → <code>127.0.0.1:32768</code>" in html
    # running without endpoints: the provider publishes no ports; the page says so
    (other,) = _post_bid(buyer, ports=[22]).json()["leases"]
    runner_client(token).post(f"/api/v1/runner/leases/{other}/events/",
                              {"status": "running", "container_id": "beef"}, format="json")
    html = client.get(reverse("leases-page")).content.decode()
    assert "ports 22 not published by this provider" in html


@pytest.mark.parametrize(("ports", "words"), [
    ([0], "greater than or equal to 1"),
    ([65536], "less than or equal to 65535"),
    (["8888"], None),
    ([True], None),
    ([8888.0], None),
    (list(range(1000, 1009)), "8"),
    ([8888, 8888], "twice"),
    ("8888", None),
])
def test_bad_ports_are_refused_and_nothing_is_written(ports, words):
    _, _, _, buyer = _market()
    before = snapshot(buyer)
    r = _post_bid(buyer, ports=ports)
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["errors"] and all(k.startswith("ports") for k in body["errors"]), body
    if words:
        assert any(words in m for msgs in body["errors"].values() for m in msgs), body
    assert snapshot(buyer) == before


def test_an_ask_cannot_name_ports():
    provider, node, _ = registered_node(name="n2")
    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 1,
        "available_until": in_a_day().isoformat(), "ports": [8888]}, format="json")
    assert_refused(r, "ports", contains="is for bids")
    assert not Order.objects.exists()


@pytest.mark.parametrize(("endpoint", "field"), [
    ({**ENDPOINT, "container_port": 22}, "endpoints[0].container_port"),
    ({**ENDPOINT, "host": "0.0.0.0"}, "endpoints[0].host"),
    ({**ENDPOINT, "host": "http://x/"}, "endpoints[0].host"),
    ({**ENDPOINT, "host_port": 0}, "endpoints[0].host_port"),
    ({**ENDPOINT, "host_port": "32768"}, "endpoints[0].host_port"),
])
def test_bad_endpoints_are_refused_and_the_lease_does_not_start(endpoint, field):
    _, _, token, buyer = _market()
    (lease_id,) = _post_bid(buyer, ports=[8888]).json()["leases"]
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease_id}/events/",
                                  {"status": "running", "container_id": "c0ffee",
                                   "endpoints": [endpoint]}, format="json")
    assert_refused(r, field)
    lease = Lease.objects.get(pk=lease_id)
    assert lease.status == "pending" and lease.endpoints == [] and lease.started_at is None


def test_a_sealed_bid_names_ports_and_its_lease_has_them():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    now = timezone.now()
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=now + timedelta(minutes=5))
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "1.50", "ports": [8888, 22]}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["ports"] == [22, 8888]
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "1.50", "ports": [70000]}, format="json")
    assert r.status_code == 400 and SealedBid.objects.count() == 1
    auctions.close_auction(auction_id=lot.pk, now=now + timedelta(minutes=6))
    assert Lease.objects.get(sealed_bid__auction=lot).ports == [22, 8888]


def test_the_bid_form_takes_ports(client):
    _, _, _, buyer = _market()
    login(client, buyer)
    form = {"gpus": "1", "hours": "1", "price": "2.50", "time_in_force": "GTC",
            "image": "gpumarket/busybox:local", "command": "", "gang_size": ""}
    r = client.post(reverse("market", args=[H100]), {**form, "ports": "8888, x"})
    assert r.status_code == 400 and "is not a TCP port" in field_error(r.content.decode(),
                                                                       "ports")
    assert not Order.objects.filter(side="bid").exists()
    r = client.post(reverse("market", args=[H100]), {**form, "ports": "8888, 6006"})
    assert r.status_code == 302
    assert Order.objects.get(side="bid").ports == [6006, 8888]
    assert Lease.objects.get().ports == [6006, 8888]
