"""What a buyer notices on the way (issue 12's "done when"): a sealed re-bid says which bid
it replaced (API, page, CLI text); a retried extend with the same Idempotency-Key (or
`request_id`, or the extend page's own hidden one) extends once and answers the lease;
the leases page shows the lease's template and its ports' roles; a missing or another
buyer's lease reads "no lease N of yours" on every lease endpoint."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from buyer_cli import render
from marketplace import auctions, leases
from marketplace.models import Lease, LeaseExtension, SealedBid
from settlement.models import Hold
from tests.factories import ask, bid, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import login
from tests.frontend.test_pages_lease_control import _messages
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db
PRICE = 2_490_000


@pytest.fixture
def lot():
    provider, node, _ = registered_node()
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                 reserve_price=2_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


def test_a_sealed_re_bid_answers_the_bid_it_replaced(lot):
    buyer = funded_buyer(1000)
    api = client_for(buyer)
    first = api.post(f"/api/v1/auctions/{lot.pk}/bids/", {"price": "2.50"}, format="json")
    assert first.status_code == 201, first.content
    assert first.json()["replaced"] is None
    second = api.post(f"/api/v1/auctions/{lot.pk}/bids/", {"price": "2.75"}, format="json")
    assert second.status_code == 201, second.content
    assert second.json()["replaced"] == first.json()["id"]
    assert SealedBid.objects.get(pk=first.json()["id"]).status == "withdrawn"
    assert "replaces sealed bid " + str(first.json()["id"]) in render.sealed_bid(second.json())
    assert "replaces" not in render.sealed_bid(first.json())


def test_the_auction_page_says_a_re_bid_replaced_the_earlier_one(client, lot):
    buyer = login(client, funded_buyer(1000))
    client.post(reverse("auction", args=[lot.pk]), {"price": "3.00"})
    earlier = SealedBid.objects.get(bidder=buyer)
    r = client.post(reverse("auction", args=[lot.pk]), {"price": "3.20"}, follow=True)
    later = SealedBid.objects.get(bidder=buyer, status="active")
    assert f"Your sealed bid #{later.pk} is in: $3.20 /GPU-h. It replaces your bid " \
           f"#{earlier.pk}, whose hold is released." in _messages(r.content.decode())
    assert Hold.objects.get(pk=earlier.hold_id).status == "released"


def _running_lease(usd: int = 100):
    provider, node, _ = registered_node()
    ask(provider, node, price=PRICE)
    buyer = funded_buyer(usd)
    [lease] = bid(buyer, price=PRICE, gpus=1).leases
    leases.mark_running(lease=lease, container_id="c" * 64)
    return buyer, lease


@pytest.mark.parametrize("how", ["header", "body", "both"])
def test_a_retried_extend_with_the_same_key_extends_once(how):
    buyer, lease = _running_lease()
    api = client_for(buyer)
    body = {"hours": 1, **({"request_id": "retry-1"} if how != "header" else {})}
    headers = {"HTTP_IDEMPOTENCY_KEY": "retry-1"} if how != "body" else {}
    first = api.post(f"/api/v1/leases/{lease.pk}/extend/", body, format="json", **headers)
    assert first.status_code == 200, first.content
    before = snapshot(buyer)
    again = api.post(f"/api/v1/leases/{lease.pk}/extend/", body, format="json", **headers)
    assert again.status_code == 200, again.content
    assert again.json()["duration_seconds"] == first.json()["duration_seconds"] == 7200
    assert again.json()["ends_at"] == first.json()["ends_at"]
    assert snapshot(buyer) == before
    assert LeaseExtension.objects.filter(lease=lease).count() == 1
    # a new key is a new extension; no key at all, too
    assert api.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 1}, format="json",
                    HTTP_IDEMPOTENCY_KEY="retry-2").json()["duration_seconds"] == 3 * 3600
    assert api.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 1},
                    format="json").json()["duration_seconds"] == 4 * 3600


def test_a_key_reused_for_another_extension_or_a_bad_key_is_refused_writing_nothing():
    buyer, lease = _running_lease()
    api = client_for(buyer)
    url = f"/api/v1/leases/{lease.pk}/extend/"
    assert api.post(url, {"hours": 1, "request_id": "k"}, format="json").status_code == 200
    before = snapshot(buyer)
    body = assert_refused(api.post(url, {"hours": 2, "request_id": "k"}, format="json"),
                          "request_id", status=409, contains="already extended lease")
    assert "3600 s" in body["detail"]
    assert_refused(api.post(url, {"hours": 1}, format="json", HTTP_IDEMPOTENCY_KEY="a b"),
                   "Idempotency-Key")
    assert_refused(api.post(url, {"hours": 1, "request_id": "x"}, format="json",
                            HTTP_IDEMPOTENCY_KEY="y"), "request_id", contains="differs")
    assert_refused(api.post(url, {"hours": 1, "request_id": 7}, format="json"), "request_id")
    assert snapshot(buyer) == before
    assert Lease.objects.get(pk=lease.pk).duration_seconds == 7200


def test_every_lease_endpoint_says_no_lease_n_of_yours():
    buyer, lease = _running_lease()
    stranger = client_for(funded_buyer(10))
    for n in (lease.pk, lease.pk + 999):
        answers = [stranger.get(f"/api/v1/leases/{n}/"),
                   stranger.get(f"/api/v1/leases/{n}/logs/"),
                   stranger.post(f"/api/v1/leases/{n}/stop/", format="json"),
                   stranger.post(f"/api/v1/leases/{n}/extend/", {"hours": 1}, format="json")]
        assert [a.status_code for a in answers] == [404] * 4
        assert {a.json()["detail"] for a in answers} == {f"no lease {n} of yours"}
    assert client_for(buyer).get(f"/api/v1/leases/{lease.pk}/").status_code == 200


def test_the_leases_page_shows_the_template_and_the_ports_roles(client):
    provider, node, _ = registered_node()
    ask(provider, node, price=PRICE)
    buyer = login(client, funded_buyer(100, ssh_key=True))
    placed = client_for(buyer).post("/api/v1/orders/", {
        "side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 1, "hours": 1, "price": "2.50",
        "template": "pytorch-jupyter", "image": "gpumarket/sshd:local", "min_cuda": "12.2"},
        format="json")
    assert placed.status_code == 201, placed.content
    [lease_id] = placed.json()["leases"]
    html = client.get(reverse("leases-page")).content.decode()
    assert "template <code>pytorch-jupyter</code>" in html
    assert "ports 22 (ssh), 8888 (jupyter): endpoint shown once running" in html
    lease = Lease.objects.get(pk=lease_id)
    leases.mark_running(lease=lease, container_id="c" * 64, endpoints=[
        {"container_port": 22, "host": "127.0.0.1", "host_port": 40022}])
    html = client.get(reverse("leases-page")).content.decode()
    assert "port 22 (ssh) → <code>127.0.0.1:40022</code>" in html


def test_the_extend_page_sent_twice_extends_once(client):
    buyer, lease = _running_lease()
    login(client, buyer)
    url = reverse("lease-extend-page", args=[lease.pk])
    page = client.get(url).content.decode()
    [request_id] = re.findall(r'<input type="hidden" name="request_id" value="([^"]+)"', page)
    assert request_id not in client.get(url).content.decode()  # new on each GET
    said = []
    for _ in range(2):  # the form sent twice (a double click, a retried POST)
        r = client.post(url, {"hours": "1", "request_id": request_id}, follow=True)
        assert r.status_code == 200
        said += _messages(r.content.decode())
    assert LeaseExtension.objects.filter(lease=lease).count() == 1
    assert Lease.objects.get(pk=lease.pk).duration_seconds == 7200
    assert said[0] == said[1] and said[0].endswith(": 2.49 USD more held."), said


@pytest.mark.django_db
def test_another_buyer_s_order_reads_as_a_missing_one_on_get_and_cancel():
    mine = bid(funded_buyer(100), price=PRICE, gpus=1).order
    other = client_for(funded_buyer(100))
    answers = [other.get(f"/api/v1/orders/{mine.pk}/"),
               other.post(f"/api/v1/orders/{mine.pk}/cancel/"),
               other.get("/api/v1/orders/999999/")]
    assert [a.status_code for a in answers] == [404, 404, 404]
    assert answers[0].json()["detail"] == f"no order {mine.pk} of yours"
    assert answers[1].json()["detail"].endswith(f"no order {mine.pk} of yours")
    assert answers[2].json()["detail"] == "no order 999999 of yours"
