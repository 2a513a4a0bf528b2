"""Sealed second-price auction through the services."""

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, book
from marketplace.errors import Conflict, InvalidInput, PermissionDenied
from marketplace.models import Auction, GpuClass, Lease
from providers.models import Gpu
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold
from tests.factories import RTX4090_DUMP, funded_buyer, registered_node

pytestmark = pytest.mark.django_db


def _auction(provider, node, **kw):
    defaults = {"gpus": 8, "reserve_price": 1_100_000, "duration_seconds": 3600,
                "closes_at": timezone.now() + timedelta(minutes=5)}
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, **{**defaults, **kw})


def test_second_price_winner_pays_second_highest_and_losers_are_released():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice, bob, carol = funded_buyer(100), funded_buyer(100), funded_buyer(100)
    auction = _auction(provider, node)
    bids = {}
    for who, price in ((alice, 1_300_000), (bob, 1_450_000), (carol, 1_200_000)):
        bids[who.pk] = auctions.place_sealed_bid(bidder_id=who.pk, auction_id=auction.pk,
                                                 price=price)
    assert auctions.close_auction(auction_id=auction.pk) is None  # not due yet
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)

    assert closed.status == "closed" and closed.clearing_price == 1_300_000
    lease = Lease.objects.get()
    assert lease.buyer == bob and lease.price == 1_300_000 and lease.gpu_count == 8
    assert Hold.objects.get(pk=lease.hold_id).amount == 1_300_000 * 8
    for loser in (alice, carol):
        assert Hold.objects.get(pk=bids[loser.pk].hold_id).status == "released"
        assert ledger.wallet(user_id=loser.pk).available == 100_000_000
        assert ledger.wallet(user_id=loser.pk).held == 0
    assert ledger.wallet(user_id=bob.pk).held == 1_300_000 * 8
    # exactly once: closing again changes nothing
    assert auctions.close_auction(auction_id=auction.pk, now=auction.closes_at) is None
    assert Lease.objects.count() == 1
    assert first_violation() is None


def test_reserve_binds_when_only_one_bid():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice = funded_buyer(100)
    auction = _auction(provider, node)
    auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk, price=2_000_000)
    closed = auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    assert closed.clearing_price == 1_100_000
    assert Lease.objects.get().price == 1_100_000


def test_refusals():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice = funded_buyer(100)
    auction = _auction(provider, node)
    with pytest.raises(InvalidInput, match="below the reserve"):
        auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk, price=1_000_000)
    with pytest.raises(PermissionDenied):
        auctions.place_sealed_bid(bidder_id=provider.pk, auction_id=auction.pk,
                                  price=2_000_000)
    with pytest.raises(InvalidInput):
        auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk, price=2_000_000,
                                  gpus=4)
    with pytest.raises(Conflict, match="closed"):
        auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk, price=2_000_000,
                                  now=auction.closes_at)
    assert Hold.objects.count() == 0


def test_a_mixed_node_must_name_its_class_for_an_auction_as_for_an_ask():
    """open_auction resolves the node's market exactly as place_ask does (book.node_market):
    a node with GPUs of two classes that names none is refused, naming gpu_class, and
    nothing is opened (it used to take the first class quietly)."""
    provider, node, _ = registered_node(RTX4090_DUMP)
    gpu = Gpu.objects.filter(node=node).order_by("pk").first()
    other = GpuClass.objects.exclude(pk=gpu.gpu_class_id).order_by("pk").first()
    Gpu.objects.filter(pk=gpu.pk).update(gpu_class=other)
    with pytest.raises(InvalidInput, match="several GPU classes") as ask_refusal:
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=1_000_000, gpus=1,
                       available_until=timezone.now() + timedelta(days=1))
    with pytest.raises(InvalidInput, match="several GPU classes") as auction_refusal:
        _auction(provider, node, gpus=1)
    assert auction_refusal.value.field == ask_refusal.value.field == "gpu_class"
    assert not Auction.objects.exists()
    # named, it opens on that class
    assert _auction(provider, node, gpus=1, market_slug=other.slug).market == other


def test_refusals_name_where_the_gpus_are_and_count_them_right():
    from tests.factories import ask
    provider, node, _ = registered_node(RTX4090_DUMP)
    placed = ask(provider, node, price=1_000_000, gpus=8)
    with pytest.raises(InvalidInput) as refused:
        _auction(provider, node, gpus=1)
    assert refused.value.field == "gpus"
    assert refused.value.message == (f"only 0 GPUs of node {node.name} are free: 8 in ask "
                                     f"{placed.order.pk} (cancel it to free them)")
    book.cancel_order(user_id=provider.pk, order_id=placed.order.pk)
    lot = _auction(provider, node, gpus=1)
    with pytest.raises(InvalidInput, match=r"^a second_price lot is all 1 GPU$"):
        auctions.place_sealed_bid(bidder_id=funded_buyer(100).pk, auction_id=lot.pk,
                                  price=2_000_000, gpus=2)
