"""DESIGN invariant 4: a sealed bid is visible before close to nobody but its bidder,
through the API and the pages; after close the public view shows awards and the
clearing price, never a losing bid's price."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.auctions import close_auction
from marketplace.models import Auction
from tests.factories import RTX4090_DUMP, UserFactory, funded_buyer, registered_node
from tests.support.api import body_text, client_for

pytestmark = pytest.mark.django_db

PUBLIC_AUCTION_KEYS = {"id", "status", "gpu_class", "node", "gpus", "reserve_price", "rule",
                       "duration_seconds", "opens_at", "closes_at", "bid_count",
                       "seconds_left", "clearing_price", "awards", "closed_at"}
# prices chosen so none is a substring of another or of the reserve (1.100000)
ALICE_PRICE, BOB_PRICE, CAROL_PRICE = "1.457300", "1.318900", "1.236700"


def _spellings(price: str) -> list[str]:
    short = price.rstrip("0")
    return [price, short, short.replace(".", ""), str(int(price.replace(".", "")))]


def _assert_hidden(text: str, *prices: str, where: str) -> None:
    for price in prices:
        for spelling in _spellings(price):
            assert spelling not in text, f"{spelling} (a sealed bid's price) leaks via {where}"


def _open(provider, node, rule):
    r = client_for(provider).post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 8, "reserve_price": "1.10", "hours": 1, "rule": rule,
        "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json")
    assert r.status_code == 201, r.content
    return r.json()["id"]


def _sealed_bid(user, auction_id, price, gpus):
    r = client_for(user).post(f"/api/v1/auctions/{auction_id}/bids/",
                              {"price": price, "gpus": gpus}, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def _public_views(auction_id, viewers):
    """Every place an outsider could read an auction from, as (where, response)."""
    anon = APIClient()
    views = [("anonymous GET /api/v1/auctions/", anon.get("/api/v1/auctions/")),
             ("anonymous GET /api/v1/auctions/<id>/", anon.get(f"/api/v1/auctions/{auction_id}/")),
             ("anonymous GET /", anon.get("/"))]
    for name, user in viewers.items():
        c = client_for(user)
        for url in ("/api/v1/auctions/", f"/api/v1/auctions/{auction_id}/",
                    "/api/v1/sealed-bids/", "/api/v1/leases/", "/api/v1/wallet/",
                    "/api/v1/ledger/entries/", "/api/v1/orders/", "/api/v1/fills/",
                    "/api/v1/gpu-classes/rtx-4090/book/"):
            views.append((f"{name} GET {url}", c.get(url)))
        c.force_login(user)
        views.append((f"{name} GET / (session)", c.get("/")))
    return views


def test_open_auction_hides_every_bid_from_everyone_but_its_bidder():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice, bob = funded_buyer(100), funded_buyer(100)
    stranger = UserFactory()
    auction_id = _open(provider, node, "uniform_price")
    a = _sealed_bid(alice, auction_id, ALICE_PRICE, 5)
    b = _sealed_bid(bob, auction_id, BOB_PRICE, 3)

    for where, r in _public_views(auction_id, {"provider": provider, "stranger": stranger}):
        assert r.status_code == 200, (where, r.status_code)
        _assert_hidden(body_text(r), ALICE_PRICE, BOB_PRICE, where=where)

    home = APIClient().get("/").content.decode()
    assert "$1.10 /GPU-h" in home and "Open sealed-bid auctions" in home  # the lot is listed

    detail = APIClient().get(f"/api/v1/auctions/{auction_id}/").json()
    assert set(detail) == PUBLIC_AUCTION_KEYS
    assert detail["bid_count"] == 2 and detail["awards"] == [] and detail["gpus"] == 8
    assert detail["clearing_price"] is None and detail["status"] == "open"
    assert 0 < detail["seconds_left"] <= 300
    public = APIClient().get("/api/v1/auctions/").json()["results"]
    listed = [x for x in public if x["id"] == auction_id]
    assert len(listed) == 1
    assert ({**listed[0], "seconds_left": 0} == {**detail, "seconds_left": 0})
    # the bids' quantities (5 and 3) are nowhere in the public view but the lot size
    assert detail["gpus"] == 8 and not any(
        isinstance(v, int) and not isinstance(v, bool) and v in (3, 5)
        for k, v in detail.items() if k not in {"id", "node"})

    # each bidder sees its own bid, and only its own
    mine_a = client_for(alice).get("/api/v1/sealed-bids/").json()["results"]
    mine_b = client_for(bob).get("/api/v1/sealed-bids/").json()["results"]
    assert [(x["id"], x["price"], x["gpus"]) for x in mine_a] == [(a["id"], ALICE_PRICE, 5)]
    assert [(x["id"], x["price"], x["gpus"]) for x in mine_b] == [(b["id"], BOB_PRICE, 3)]
    _assert_hidden(body_text(client_for(bob).get("/api/v1/sealed-bids/")), ALICE_PRICE,
                   where="bob's sealed-bids")
    _assert_hidden(body_text(client_for(alice).get("/api/v1/sealed-bids/")), BOB_PRICE,
                   where="alice's sealed-bids")
    # and nobody can withdraw someone else's bid (the answer says nothing of it)
    r = client_for(bob).post(f"/api/v1/sealed-bids/{a['id']}/withdraw/")
    assert r.status_code == 404
    _assert_hidden(body_text(r), ALICE_PRICE, where="withdraw answer")


def test_after_close_awards_are_public_and_losing_prices_stay_sealed():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice, bob, carol = funded_buyer(100), funded_buyer(100), funded_buyer(100)
    stranger = UserFactory()
    auction_id = _open(provider, node, "second_price")
    _sealed_bid(alice, auction_id, ALICE_PRICE, 8)
    _sealed_bid(bob, auction_id, BOB_PRICE, 8)
    _sealed_bid(carol, auction_id, CAROL_PRICE, 8)

    auction = Auction.objects.get(pk=auction_id)
    assert close_auction(auction_id=auction_id, now=auction.closes_at) is not None

    detail = APIClient().get(f"/api/v1/auctions/{auction_id}/").json()
    assert detail["status"] == "closed" and detail["bid_count"] == 3
    # Vickrey: alice wins all 8 GPUs at bob's (second-highest) price
    assert detail["clearing_price"] == BOB_PRICE
    # anonymous: no bid id, no bidder (DESIGN: the public sees GPUs and prices)
    assert detail["awards"] == [{"gpus": 8, "price": BOB_PRICE}]
    assert detail["seconds_left"] == 0 and detail["closed_at"]
    # carol lost: her price is nowhere public; neither is the winner's own limit
    for where, r in _public_views(auction_id, {"provider": provider, "stranger": stranger}):
        assert r.status_code == 200, (where, r.status_code)
        _assert_hidden(body_text(r), CAROL_PRICE, ALICE_PRICE, where=where)
    # the losers see their own bids as lost, the winner its award
    carol_bids = client_for(carol).get("/api/v1/sealed-bids/").json()["results"]
    assert [(x["status"], x["price"], x["paid_price"]) for x in carol_bids] == [
        ("lost", CAROL_PRICE, None)]
    alice_bids = client_for(alice).get("/api/v1/sealed-bids/").json()["results"]
    assert alice_bids[0]["status"] == "won" and alice_bids[0]["paid_price"] == BOB_PRICE
