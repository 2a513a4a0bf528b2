"""A lease's hold names the lease ("lease:<id>"), whether placed for a fill or a sealed
bid's hold that won; the wallet (API and CLI) shows that name."""

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Lease
from settlement.models import Hold
from tests.factories import RTX4090_DUMP, ask, bid, funded_buyer, registered_node
from tests.support.api import client_for

pytestmark = pytest.mark.django_db


def test_a_fills_lease_hold_names_the_lease_in_the_wallet():
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000, gpus=8)
    buyer = funded_buyer(100)
    bid(buyer, price=2_500_000, gpus=1)
    lease = Lease.objects.get(buyer=buyer)
    assert Hold.objects.get(pk=lease.hold_id).reference == f"lease:{lease.pk}"
    holds = client_for(buyer).get("/api/v1/wallet/").json()["holds"]
    assert [h["reference"] for h in holds] == [f"lease:{lease.pk}"]


def test_a_won_sealed_bids_hold_is_renamed_to_its_lease():
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer = funded_buyer(100)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_100_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    sealed = auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk,
                                       price=1_300_000)
    assert Hold.objects.get(pk=sealed.hold_id).reference == f"auction:{auction.pk}"
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    lease = Lease.objects.get()
    assert lease.hold_id == sealed.hold_id
    assert Hold.objects.get(pk=lease.hold_id).reference == f"lease:{lease.pk}"
