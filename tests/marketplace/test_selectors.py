"""marketplace/selectors.py: the reads that pages, the API and the feed share. Invariant 4
in one function: before close a sealed bid is visible to its bidder only; after close the
winning bids are public and every other bid stays its bidder's. A real lot on PostgreSQL,
bid on and closed through the auction services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, selectors
from marketplace.models import Lease, SealedBid
from tests.factories import RTX4090_DUMP, UserFactory, funded_buyer, registered_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def lot():
    """8 GPUs, uniform price: alice 5 and bob 3 will win, carol (4 at the lowest price)
    will lose, dave withdraws."""
    provider, node, _ = registered_node(RTX4090_DUMP)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    rule="uniform_price",
                                    closes_at=timezone.now() + timedelta(minutes=5))
    alice, bob, carol, dave = (funded_buyer(100) for _ in range(4))
    bids = {
        "alice": auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk,
                                           price=3_000_000, gpus=5),
        "bob": auctions.place_sealed_bid(bidder_id=bob.pk, auction_id=auction.pk,
                                         price=2_500_000, gpus=3),
        "carol": auctions.place_sealed_bid(bidder_id=carol.pk, auction_id=auction.pk,
                                           price=1_500_000, gpus=4),
        "dave": auctions.place_sealed_bid(bidder_id=dave.pk, auction_id=auction.pk,
                                          price=4_000_000, gpus=2),
    }
    auctions.withdraw_sealed_bid(bidder_id=dave.pk, bid_id=bids["dave"].pk)
    users = {"alice": alice, "bob": bob, "carol": carol, "dave": dave, "provider": provider,
             "stranger": UserFactory()}
    return auction, users, bids


def _ids(qs) -> set[int]:
    return set(qs.values_list("pk", flat=True))


def test_before_close_each_bid_is_visible_to_its_bidder_only(lot):
    auction, users, bids = lot
    for name in ("alice", "bob", "carol", "dave"):
        assert _ids(selectors.visible_bids(users[name].pk)) == {bids[name].pk}, name
        assert _ids(selectors.own_bids(users[name].pk)) == {bids[name].pk}, name
    for name in ("provider", "stranger"):
        assert _ids(selectors.visible_bids(users[name].pk)) == set(), name
        assert _ids(selectors.own_bids(users[name].pk)) == set(), name
    assert _ids(selectors.visible_bids(None)) == set()
    assert _ids(selectors.awards(auction)) == set()
    assert _ids(SealedBid.objects.filter(selectors.sealed_bid_q())) == \
        {b.pk for b in bids.values()}
    assert selectors.bid_count(auction) == 3  # active ones: dave's withdrawn bid is not


def test_after_close_the_winning_bids_are_public_and_the_others_stay_their_bidders(lot):
    auction, users, bids = lot
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    auction.refresh_from_db()
    statuses = {n: SealedBid.objects.get(pk=b.pk).status for n, b in bids.items()}
    assert statuses == {"alice": "won", "bob": "won", "carol": "lost", "dave": "withdrawn"}
    winners = {bids["alice"].pk, bids["bob"].pk}
    assert _ids(selectors.visible_bids(None)) == winners
    assert _ids(selectors.awards(auction)) == winners
    for name in ("alice", "bob", "provider", "stranger"):
        assert _ids(selectors.visible_bids(users[name].pk)) == winners, name
    assert _ids(selectors.visible_bids(users["carol"].pk)) == winners | {bids["carol"].pk}
    assert _ids(selectors.visible_bids(users["dave"].pk)) == winners | {bids["dave"].pk}
    assert _ids(selectors.own_bids(users["carol"].pk)) == {bids["carol"].pk}
    assert _ids(selectors.own_bids(users["alice"].pk)) == {bids["alice"].pk}
    # sealed_bid_q (the admin's masking) is exactly what no anonymous viewer sees
    assert _ids(SealedBid.objects.filter(selectors.sealed_bid_q())) == \
        {bids["carol"].pk, bids["dave"].pk}
    assert selectors.bid_count(auction) == 3  # won and lost; not the withdrawn one


def test_user_leases_are_those_of_the_buyer_or_the_provider(lot):
    auction, users, bids = lot
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    alice_lease = Lease.objects.get(sealed_bid=bids["alice"]).pk
    bob_lease = Lease.objects.get(sealed_bid=bids["bob"]).pk
    assert _ids(selectors.user_leases(users["alice"].pk)) == {alice_lease}
    assert _ids(selectors.user_leases(users["bob"].pk)) == {bob_lease}
    assert _ids(selectors.user_leases(users["provider"].pk)) == {alice_lease, bob_lease}
    for name in ("carol", "dave", "stranger"):
        assert _ids(selectors.user_leases(users[name].pk)) == set(), name
