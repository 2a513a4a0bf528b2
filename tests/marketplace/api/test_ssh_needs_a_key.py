"""A bid with `ssh` from an account with no SSH key is refused at placement — API bid,
sealed bid and the page forms alike: a 400 naming `ssh` that says to add a key, nothing
written (no order, hold or sealed bid). With one key the same bid is placed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from tests.factories import H100, ask, bid_body, funded_buyer, registered_node, with_ssh_key
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db
ADD_A_KEY = "/api/v1/ssh-keys/"
PAGE_BID = {"gpus": "1", "hours": "1", "price": "2.50", "gang_size": "", "time_in_force": "GTC",
            "image": "", "command": "", "ports": "", "min_cuda": "", "ssh": "yes"}


def _auction(name: str = "node-1"):
    provider, node, _ = registered_node(name=name, own_uuids=True)
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=1,
                                 reserve_price=1_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


@pytest.mark.parametrize("body", [{"ssh": True}, {"template": "cuda-ssh"}])
def test_an_api_bid_with_ssh_and_no_key_is_a_400_naming_ssh(body):
    provider, node, _ = registered_node()
    ask(provider, node, gpus=8)
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=1, **body), format="json")
    assert_refused(r, "ssh", contains=ADD_A_KEY)
    assert snapshot(buyer) == before
    with_ssh_key(buyer)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=1, **body), format="json")
    assert r.status_code == 201, r.content


def test_a_sealed_bid_with_ssh_and_no_key_is_a_400_naming_ssh():
    auction = _auction()
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    url = f"/api/v1/auctions/{auction.pk}/bids/"
    r = client_for(buyer).post(url, {"price": "2.00", "ssh": True}, format="json")
    assert_refused(r, "ssh", contains="wallet page")
    assert snapshot(buyer) == before
    with_ssh_key(buyer)
    assert client_for(buyer).post(url, {"price": "2.00", "ssh": True},
                                  format="json").status_code == 201


def test_the_page_forms_refuse_ssh_without_a_key_next_to_the_field(client):
    provider, node, _ = registered_node()
    ask(provider, node, gpus=8)
    buyer = login(client, funded_buyer(100))
    before = snapshot(buyer)
    r = client.post(reverse("market", args=[H100]), PAGE_BID)
    assert r.status_code == 400
    assert "add one first" in field_error(r.content.decode(), "ssh")
    sealed = {"price": "1.50", "gpus": "", "min_gpus": "", "image": "", "command": "",
              "ports": "", "min_cuda": "", "ssh": "yes", "template": ""}
    r = client.post(reverse("auction", args=[_auction("node-2").pk]), sealed)
    assert r.status_code == 400
    assert "add one first" in field_error(r.content.decode(), "ssh")
    assert snapshot(buyer) == before
