"""Sealed multi-unit auctions (uniform_price, first_price) through the services and the
API, with hand-computed examples of DESIGN.md "The two auctions":

    rank bids by price (high first), then time, then id; give each bid
    min(wanted, GPUs left); a bid whose minimum cannot be met gets nothing and the walk
    goes on. uniform_price: every winner pays max(reserve, min(H, L)), H the highest
    price of any bid-unit left unallocated (none: H = reserve), L the lowest winning
    price. first_price: each winner pays its own bid.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Lease, LeaseGpu, SealedBid
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold
from settlement.money import lease_cost
from tests.factories import RTX4090_DUMP, funded_buyer, registered_node
from tests.support.api import client_for

pytestmark = pytest.mark.django_db

RESERVE = 1_000_000
HOUR = 3600


def _lot(rule: str):
    provider, node, _ = registered_node(RTX4090_DUMP)  # 8 × RTX 4090
    auction = auctions.open_auction(
        provider_id=provider.pk, node_id=node.pk, gpus=8, reserve_price=RESERVE,
        duration_seconds=HOUR, closes_at=timezone.now() + timedelta(minutes=5), rule=rule)
    return provider, node, auction


def _bids(auction, table):
    """table: (name, price, gpus, min_gpus) in time order → {name: (buyer, SealedBid)}."""
    placed = {}
    for name, price, gpus, min_gpus in table:
        buyer = funded_buyer(100)
        placed[name] = (buyer, auctions.place_sealed_bid(
            bidder_id=buyer.pk, auction_id=auction.pk, price=price, gpus=gpus,
            min_gpus=min_gpus))
    return placed


# alice 3 (left 5); bob 4 (left 1); carol wants 4, minimum 2 > 1 left: nothing, the walk
# goes on; dave, later and smaller, gets 1 of his 2 (minimum 1). Unallocated bid-units:
# carol's 4 at 1.60 and dave's 1 at 1.20, so H = 1.60; L = dave's 1.20.
WALK = [("alice", 2_000_000, 3, 3), ("bob", 1_800_000, 4, 4), ("carol", 1_600_000, 4, 2),
        ("dave", 1_200_000, 2, 1)]
WALK_AWARDS = {"alice": 3, "bob": 4, "dave": 1}


def _assert_settled(auction, placed, awards: dict[str, int], prices: dict[str, int]):
    leases = {lease.buyer_id: lease for lease in Lease.objects.filter(
        sealed_bid__auction=auction)}
    assert len(leases) == len(awards)  # one lease per winner
    gpu_sets = []
    for name, (buyer, bid) in placed.items():
        bid.refresh_from_db()
        if name not in awards:
            assert bid.status == SealedBid.Status.LOST and buyer.pk not in leases
            assert Hold.objects.get(pk=bid.hold_id).status == "released"
            assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(100_000_000, 0, 0)
            continue
        lease = leases[buyer.pk]
        cost = lease_cost(prices[name], awards[name], HOUR)
        assert (bid.status, bid.awarded_gpus, bid.paid_price) == ("won", awards[name],
                                                                   prices[name])
        assert (lease.gpu_count, lease.price, lease.status) == (awards[name], prices[name],
                                                                "pending")
        assert lease.hold_id == bid.hold_id and Hold.objects.get(pk=lease.hold_id).amount == cost
        assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(100_000_000 - cost, cost, 0)
        gpus = set(LeaseGpu.objects.filter(lease=lease, active=True)
                   .values_list("gpu_id", flat=True))
        assert len(gpus) == awards[name]
        gpu_sets.append(gpus)
    every = set().union(*gpu_sets)
    assert len(every) == sum(awards.values()) == sum(len(g) for g in gpu_sets)  # distinct
    assert first_violation() is None


def test_uniform_price_skips_an_unmeetable_minimum_and_a_later_smaller_bid_wins():
    _, _, auction = _lot("uniform_price")
    placed = _bids(auction, WALK)
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    # max(reserve 1.00, min(H 1.60, L 1.20)) = 1.20 for every winner
    assert closed.clearing_price == 1_200_000
    _assert_settled(auction, placed, WALK_AWARDS, dict.fromkeys(WALK_AWARDS, 1_200_000))


def test_uniform_price_without_minimums_is_the_highest_losing_bid():
    _, _, auction = _lot("uniform_price")
    placed = _bids(auction, [("alice", 2_000_000, 4, 1), ("bob", 1_500_000, 4, 1),
                             ("carol", 1_400_000, 4, 1)])
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    # H = carol's 1.40 (unallocated), L = 1.50 → 1.40
    assert closed.clearing_price == 1_400_000
    _assert_settled(auction, placed, {"alice": 4, "bob": 4},
                    {"alice": 1_400_000, "bob": 1_400_000})


def test_uniform_price_with_all_demand_met_pays_the_reserve():
    _, _, auction = _lot("uniform_price")
    placed = _bids(auction, [("alice", 2_000_000, 3, 3), ("bob", 1_500_000, 2, 1)])
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    # no unit unallocated: H = reserve 1.00; L = 1.50 → max(1.00, min(1.00, 1.50)) = 1.00
    assert closed.clearing_price == RESERVE
    _assert_settled(auction, placed, {"alice": 3, "bob": 2},
                    {"alice": RESERVE, "bob": RESERVE})


def test_uniform_price_ties_go_to_the_earlier_bid():
    _, _, auction = _lot("uniform_price")
    placed = _bids(auction, [("early", 1_500_000, 5, 5), ("late", 1_500_000, 5, 5),
                             ("low", 1_100_000, 3, 3)])
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    # early 5 (left 3); late's minimum 5 > 3: nothing; low 3. H = 1.50 (late's units),
    # L = 1.10 → 1.10
    assert closed.clearing_price == 1_100_000
    _assert_settled(auction, placed, {"early": 5, "low": 3},
                    {"early": 1_100_000, "low": 1_100_000})


def test_first_price_each_winner_pays_its_own_bid():
    _, _, auction = _lot("first_price")
    placed = _bids(auction, WALK)
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    assert closed.clearing_price is None
    _assert_settled(auction, placed, WALK_AWARDS,
                    {"alice": 2_000_000, "bob": 1_800_000, "dave": 1_200_000})


def test_multi_unit_through_the_api():
    provider, node, _ = registered_node(RTX4090_DUMP)
    closes_at = timezone.now() + timedelta(minutes=5)
    r = client_for(provider).post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 8, "reserve_price": "1.00", "hours": 1,
        "rule": "uniform_price", "closes_at": closes_at.isoformat()}, format="json")
    assert r.status_code == 201, r.json()
    auction_id = r.json()["id"]
    buyers = {}
    for name, price, gpus, min_gpus in WALK:
        buyers[name] = funded_buyer(100)
        r = client_for(buyers[name]).post(
            f"/api/v1/auctions/{auction_id}/bids/",
            {"price": f"{price / 1_000_000:.2f}", "gpus": gpus, "min_gpus": min_gpus},
            format="json")
        assert r.status_code == 201, r.json()
    # a minimum above gpus is refused, naming the field
    r = client_for(funded_buyer(100)).post(f"/api/v1/auctions/{auction_id}/bids/",
                                           {"price": "1.50", "gpus": 2, "min_gpus": 3},
                                           format="json")
    assert r.status_code == 400 and "min_gpus" in r.json()["errors"]

    auctions.close_auction(auction_id=auction_id, now=closes_at)
    public = client_for().get(f"/api/v1/auctions/{auction_id}/").json()
    assert public["status"] == "closed" and public["clearing_price"] == "1.200000"
    assert sorted((a["gpus"], a["price"]) for a in public["awards"]) == sorted(
        (g, "1.200000") for g in WALK_AWARDS.values())
    assert all(set(a) == {"gpus", "price"} for a in public["awards"])  # anonymous
    mine = client_for(buyers["carol"]).get("/api/v1/sealed-bids/").json()["results"]
    assert [(b["status"], b["awarded_gpus"], b["paid_price"]) for b in mine] == [
        ("lost", 0, None)]
    mine = client_for(buyers["dave"]).get("/api/v1/sealed-bids/").json()["results"]
    assert [(b["status"], b["awarded_gpus"], b["paid_price"]) for b in mine] == [
        ("won", 1, "1.200000")]
    leases = client_for(buyers["bob"]).get("/api/v1/leases/").json()["results"]
    assert [(x["gpu_count"], x["price"], len(x["gpu_uuids"])) for x in leases] == [
        (4, "1.200000", 4)]
    assert first_violation() is None
