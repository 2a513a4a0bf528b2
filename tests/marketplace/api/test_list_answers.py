"""What lists and ended orders tell a client: an order that ended without filling says why
(OrderSerializer's `cause`: an unfilled IOC, self-trade prevention against your own bid);
a list refuses an unknown or repeated query parameter; leases filter by `?status=`."""

from __future__ import annotations

import pytest

from settlement import services as ledger
from tests.factories import ask, bid_body, funded_buyer, registered_node
from tests.support.api import client_for

pytestmark = pytest.mark.django_db


def test_an_unfilled_ioc_bid_says_why_it_was_cancelled():
    buyer = funded_buyer(100)
    api = client_for(buyer)
    r = api.post("/api/v1/orders/", bid_body(price="2.00", time_in_force="IOC"), format="json")
    assert r.status_code == 201, r.content
    placed = r.json()
    assert placed["status"] == "cancelled" and placed["cause"], placed
    again = api.get(f"/api/v1/orders/{placed['id']}/").json()
    assert again["cause"] == placed["cause"]
    [listed] = api.get("/api/v1/orders/").json()["results"]
    assert listed["cause"] == placed["cause"]


def test_a_providers_own_bid_cancels_its_ask_and_the_ask_says_so():
    provider, node, _ = registered_node()
    own = ask(provider, node, price=500_000, gpus=2)
    ledger.dev_credit(user_id=provider.pk, amount=100_000_000)  # the provider bids too
    api = client_for(provider)
    r = api.post("/api/v1/orders/", bid_body(price="0.60", gpus=1), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["cause"] is None  # the bid rests: it has no cause
    order = api.get(f"/api/v1/orders/{own.order.pk}/").json()
    assert order["status"] == "cancelled"
    assert order["cause"] == f"self-trade prevention against order {r.json()['id']}"
    standing = api.get(f"/api/v1/orders/{r.json()['id']}/").json()
    assert standing["status"] == "open" and standing["cause"] is None


def test_lists_refuse_an_unknown_or_repeated_parameter_and_leases_filter_by_status():
    buyer = funded_buyer(100)
    api = client_for(buyer)
    for url, name in (("/api/v1/orders/?foo=bar", "foo"),
                      ("/api/v1/sealed-bids/?auction=abc", "auction"),
                      ("/api/v1/leases/?limit=1&limit=2", "limit"),
                      ("/api/v1/leases/?status=bogus", "status")):
        r = api.get(url)
        assert r.status_code == 400 and name in r.json()["errors"], (url, r.content)
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000, gpus=2)
    api.post("/api/v1/orders/", bid_body(price="2.00", gpus=1), format="json")
    assert api.get("/api/v1/leases/?status=pending").json()["count"] == 1
    assert api.get("/api/v1/leases/?status=running,completed").json()["count"] == 0


def test_offers_and_history_refuse_a_repeated_parameter_and_name_a_missing_class():
    api = client_for(funded_buyer(1))
    for url, name in (("/api/v1/gpu-classes/a10/offers/?sort=price&sort=gpus", "sort"),
                      ("/api/v1/gpu-classes/a10/history/?range=1h&range=7d", "range")):
        r = api.get(url)
        assert r.status_code == 400 and name in r.json()["errors"], (url, r.content)
    missing = api.get("/api/v1/gpu-classes/nope/offers/")
    assert missing.status_code == 404 and missing.json()["detail"] == "no GPU class nope"
