"""Invariant 5 at the HTTP boundary: bad input on orders, auctions and sealed bids gets a
4xx naming the field, and writes nothing (no order, hold, journal entry, lease or sealed
bid; wallets unchanged)."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

from marketplace.models import Auction, SealedBid
from tests.factories import (
    MISSING,
    RTX4090_DUMP,
    ask_body,
    bid_body,
    funded_buyer,
    registered_node,
)
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db

BAD_PRICES = [
    pytest.param("0", id="zero"),
    pytest.param("0.000000", id="zero-6dp"),
    pytest.param("-1.50", id="negative"),
    pytest.param("2.4900001", id="7-decimals"),
    pytest.param(2.49, id="json-number"),
    pytest.param(2, id="json-int"),
    pytest.param("NaN", id="nan"),
    pytest.param("Infinity", id="infinity"),
    pytest.param("-Infinity", id="minus-infinity"),
    pytest.param("1e3", id="exponent"),
    pytest.param("", id="empty"),
    pytest.param(" 2.49", id="space"),
    pytest.param("2.", id="trailing-dot"),
    pytest.param("+2.49", id="plus-sign"),
    pytest.param(None, id="null"),
    pytest.param(True, id="bool"),
    pytest.param("99999999999999", id="too-large"),
]

BAD_GPUS = [
    pytest.param("2", id="string"),
    pytest.param(0, id="zero"),
    pytest.param(-1, id="negative"),
    pytest.param(10**9, id="1e9"),
    pytest.param(2.0, id="float"),
    pytest.param(True, id="bool"),
    pytest.param(None, id="null"),
]


@pytest.fixture
def market():
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer = funded_buyer(100)
    return provider, node, buyer


_bid = partial(bid_body, gpu_class="rtx-4090", price="1.50")


def _refused_and_unchanged(client, url, body, field, users, *, status=400, contains=None):
    before = snapshot(*users)
    response = client.post(url, body, format="json")
    assert_refused(response, field, status=status, contains=contains)
    assert snapshot(*users) == before
    return response


# --- sanity: the valid bodies these tests mutate are accepted ---------------------------

def test_valid_bid_and_ask_are_accepted(market):
    provider, node, buyer = market
    r = client_for(buyer).post("/api/v1/orders/", _bid(), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["price"] == "1.500000" and r.json()["hours"] == 1
    r = client_for(provider).post("/api/v1/orders/", ask_body(node, price="1.60"), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["leases"] == []  # 1.60 ask does not cross the 1.50 bid


# --- bids -------------------------------------------------------------------------------

@pytest.mark.parametrize("price", BAD_PRICES)
def test_bid_bad_price(market, price):
    provider, _, buyer = market
    _refused_and_unchanged(client_for(buyer), "/api/v1/orders/", _bid(price=price), "price",
                           [buyer, provider])


@pytest.mark.parametrize("gpus", BAD_GPUS)
def test_bid_bad_gpus(market, gpus):
    provider, _, buyer = market
    _refused_and_unchanged(client_for(buyer), "/api/v1/orders/", _bid(gpus=gpus), "gpus",
                           [buyer, provider])


@pytest.mark.parametrize(("changes", "field"), [
    pytest.param({"gpu_class": "h200-nonexistent"}, "gpu_class", id="unknown-class"),
    pytest.param({"gpu_class": MISSING}, "gpu_class", id="missing-class"),
    pytest.param({"gpus": 4, "gang_size": 3}, "gang_size", id="gang-not-dividing"),
    pytest.param({"gpus": 2, "gang_size": 4}, "gang_size", id="gang-larger"),
    pytest.param({"gang_size": 0}, "gang_size", id="gang-zero"),
    pytest.param({"gang_size": "2"}, "gang_size", id="gang-string"),
    pytest.param({"hours": MISSING}, "hours", id="missing-duration"),
    pytest.param({"duration_seconds": 3600}, "hours", id="both-durations"),
    pytest.param({"hours": 0}, "hours", id="hours-zero"),
    pytest.param({"hours": "1"}, "hours", id="hours-string"),
    pytest.param({"hours": 1.5}, "hours", id="hours-fraction"),
    pytest.param({"hours": 10**6}, "hours", id="hours-too-many"),
    pytest.param({"hours": MISSING, "duration_seconds": 0}, "duration_seconds",
                 id="seconds-zero"),
    pytest.param({"time_in_force": "GTD"}, "time_in_force", id="bad-tif"),
    pytest.param({"side": "buy"}, "side", id="bad-side"),
])
def test_bid_bad_fields(market, changes, field):
    provider, _, buyer = market
    _refused_and_unchanged(client_for(buyer), "/api/v1/orders/", _bid(**changes), field,
                           [buyer, provider])


def test_bid_beyond_balance(market):
    provider, _, buyer = market
    # 100 USD funded; 60 × 2 GPUs × 1 h = 120 USD to hold
    r = _refused_and_unchanged(client_for(buyer), "/api/v1/orders/", _bid(price="60.00"),
                               "price", [buyer, provider], contains="insufficient balance")
    assert r.json()["detail"].startswith("price: insufficient balance")


def test_bid_whose_hold_overflows_is_a_400(market):
    # 10^12 USD × 16 GPUs × 1 h is beyond PostgreSQL bigint: once a 500 (DataError)
    provider, _, buyer = market
    _refused_and_unchanged(client_for(buyer), "/api/v1/orders/",
                           _bid(price="999999999999.999999", gpus=16, gang_size=1),
                           "price", [buyer, provider], contains="largest amount")


def test_bid_whose_cost_floors_to_zero_is_a_400(market):
    # 0.000001 USD × 1 GPU × 1 s floors to 0 micro-USD: once a 500 (zero hold)
    provider, _, buyer = market
    _refused_and_unchanged(client_for(buyer), "/api/v1/orders/",
                           _bid(price="0.000001", gpus=1, hours=MISSING, duration_seconds=1),
                           "price", [buyer, provider], contains="rounds down to 0")


def test_sealed_bid_whose_cost_floors_to_zero_is_a_400(market):
    provider, node, buyer = market
    # the lot as a whole costs 8 × 1 × 450 // 3600 = 1 micro-USD; 8 GPUs × 1 s is 0
    _auction_unchanged(
        client_for(provider),
        _auction(node, reserve_price="0.000001", hours=MISSING, duration_seconds=1),
        "reserve_price", [buyer, provider])
    r = client_for(provider).post(
        "/api/v1/auctions/",
        _auction(node, reserve_price="0.000001", hours=MISSING, duration_seconds=450),
        format="json")
    assert r.status_code == 201, r.content
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{r.json()['id']}/bids/",
                           {"price": "0.000001", "gpus": 1}, "price", [buyer, provider])


def test_sealed_bid_whose_hold_overflows_is_a_400(market):
    provider, node, buyer = market
    r = client_for(provider).post("/api/v1/auctions/", _auction(node, hours=8784),
                                  format="json")
    assert r.status_code == 201, r.content
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{r.json()['id']}/bids/",
                           {"price": "999999999999.999999", "gpus": 8}, "price",
                           [buyer, provider])


# --- asks -------------------------------------------------------------------------------

@pytest.mark.parametrize("price", BAD_PRICES)
def test_ask_bad_price(market, price):
    provider, node, buyer = market
    _refused_and_unchanged(client_for(provider), "/api/v1/orders/", ask_body(node, price=price),
                           "price", [buyer, provider])


@pytest.mark.parametrize("gpus", [*BAD_GPUS, pytest.param(9, id="more-than-node")])
def test_ask_bad_gpus(market, gpus):
    provider, node, buyer = market
    _refused_and_unchanged(client_for(provider), "/api/v1/orders/", ask_body(node, gpus=gpus),
                           "gpus", [buyer, provider])


def test_ask_bad_fields(market):
    provider, node, buyer = market
    client, users = client_for(provider), [buyer, provider]
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    for changes, field in [
        ({"available_until": past}, "available_until"),
        ({"available_until": MISSING}, "available_until"),
        ({"available_until": "tomorrow"}, "available_until"),
        ({"node": MISSING}, "node"),
        ({"node": str(node.pk)}, "node"),
        ({"gpu_class": "h100-sxm-80gb"}, "gpu_class"),   # the node has none
        ({"gpu_class": "no-such-class"}, "gpu_class"),
    ]:
        _refused_and_unchanged(client, "/api/v1/orders/", ask_body(node, **changes), field, users)
    # a node that does not exist and someone else's node: the same 404 (which ids exist
    # is not revealed)
    missing = node.pk + 1000
    r = _refused_and_unchanged(client, "/api/v1/orders/", ask_body(node, node=missing), "node",
                               users, status=404)
    assert r.json()["errors"]["node"] == [f"no node {missing} of yours"]
    r = _refused_and_unchanged(client_for(buyer), "/api/v1/orders/", ask_body(node), "node", users,
                               status=404)
    assert r.json()["errors"]["node"] == [f"no node {node.pk} of yours"]


# --- auctions ---------------------------------------------------------------------------

def _auction(node_obj, /, **changes):
    body = {"node": node_obj.pk, "gpus": 8, "reserve_price": "1.10", "hours": 1,
            "rule": "uniform_price",
            "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not MISSING}


def _auction_unchanged(client, body, field, users, *, status=400):
    count = Auction.objects.count()
    _refused_and_unchanged(client, "/api/v1/auctions/", body, field, users, status=status)
    assert Auction.objects.count() == count


@pytest.mark.parametrize("price", BAD_PRICES)
def test_auction_bad_reserve(market, price):
    provider, node, buyer = market
    _auction_unchanged(client_for(provider), _auction(node, reserve_price=price),
                       "reserve_price", [buyer, provider])


@pytest.mark.parametrize("gpus", [*BAD_GPUS, pytest.param(9, id="more-than-node")])
def test_auction_bad_gpus(market, gpus):
    provider, node, buyer = market
    _auction_unchanged(client_for(provider), _auction(node, gpus=gpus), "gpus",
                       [buyer, provider])


def test_auction_bad_fields(market):
    provider, node, buyer = market
    client, users = client_for(provider), [buyer, provider]
    past = (timezone.now() - timedelta(seconds=30)).isoformat()
    for changes, field in [
        ({"hours": MISSING}, "hours"),
        ({"duration_seconds": 3600}, "hours"),
        ({"hours": 0}, "hours"),
        ({"hours": "1"}, "hours"),
        ({"closes_at": past}, "closes_at"),
        ({"closes_at": MISSING}, "closes_at"),
        ({"closes_at": "soon"}, "closes_at"),
        ({"rule": "dutch"}, "rule"),
        ({"gpu_class": "no-such-class"}, "gpu_class"),
        ({"node": "1"}, "node"),
    ]:
        _auction_unchanged(client, _auction(node, **changes), field, users)
    # someone else's node and a node that does not exist: the same 404
    _auction_unchanged(client_for(buyer), _auction(node), "node", users, status=404)
    _auction_unchanged(client, _auction(node, node=node.pk + 1000), "node", users,
                       status=404)


# --- sealed bids ------------------------------------------------------------------------

@pytest.fixture
def open_auction(market):
    provider, node, buyer = market
    r = client_for(provider).post("/api/v1/auctions/", _auction(node), format="json")
    assert r.status_code == 201, r.content
    return provider, buyer, r.json()["id"]


def _sealed(**changes):
    body = {"price": "1.20", "gpus": 2}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not MISSING}


@pytest.mark.parametrize("price", [*BAD_PRICES, pytest.param("1.00", id="below-reserve")])
def test_sealed_bid_bad_price(open_auction, price):
    provider, buyer, auction_id = open_auction
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{auction_id}/bids/",
                           _sealed(price=price), "price", [buyer, provider])


@pytest.mark.parametrize("gpus", [*BAD_GPUS, pytest.param(9, id="more-than-lot")])
def test_sealed_bid_bad_gpus(open_auction, gpus):
    provider, buyer, auction_id = open_auction
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{auction_id}/bids/",
                           _sealed(gpus=gpus), "gpus", [buyer, provider])


def test_sealed_bid_other_refusals(open_auction):
    provider, buyer, auction_id = open_auction
    url, users = f"/api/v1/auctions/{auction_id}/bids/", [buyer, provider]
    _refused_and_unchanged(client_for(buyer), url, _sealed(min_gpus=3), "min_gpus", users)
    _refused_and_unchanged(client_for(buyer), url, _sealed(min_gpus="1"), "min_gpus", users)
    _refused_and_unchanged(client_for(provider), url, _sealed(), "auction", users, status=403)
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{auction_id + 1000}/bids/",
                           _sealed(), "auction", users, status=404)


def test_sealed_bid_beyond_balance_keeps_the_previous_bid(open_auction):
    provider, buyer, auction_id = open_auction
    url = f"/api/v1/auctions/{auction_id}/bids/"
    first = client_for(buyer).post(url, _sealed(), format="json")
    assert first.status_code == 201, first.content
    # 20 × 8 GPUs × 1 h = 160 USD > the 100 funded: refused, and the replaced bid stays
    _refused_and_unchanged(client_for(buyer), url, _sealed(price="20.00", gpus=8), "price",
                           [buyer, provider], contains="insufficient balance")
    assert SealedBid.objects.get(pk=first.json()["id"]).status == "active"


def test_second_price_lot_is_all_or_nothing(market):
    provider, node, buyer = market
    r = client_for(provider).post("/api/v1/auctions/", _auction(node, rule="second_price"),
                                  format="json")
    assert r.status_code == 201, r.content
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{r.json()['id']}/bids/",
                           _sealed(gpus=4), "gpus", [buyer, provider])


def test_bid_on_closed_auction_is_a_conflict(open_auction):
    from marketplace.auctions import close_auction

    provider, buyer, auction_id = open_auction
    closes_at = Auction.objects.get(pk=auction_id).closes_at
    close_auction(auction_id=auction_id, now=closes_at)
    _refused_and_unchanged(client_for(buyer), f"/api/v1/auctions/{auction_id}/bids/",
                           _sealed(), "auction", [buyer, provider], status=409)
