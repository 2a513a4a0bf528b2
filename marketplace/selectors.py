"""Reads that pages, the API and the feed share.

Sealed bids (DESIGN invariant 4): `sealed_bid_q` says which bids' figures stay secret.
"""

from __future__ import annotations

from django.db.models import Q

from marketplace.models import Auction, SealedBid


def sealed_bid_q(prefix: str = "") -> Q:
    """The sealed bids whose figures stay secret (for `SealedBid`, or through `prefix`,
    e.g. "sealed_bid__"): every bid but a winning bid of a closed auction — before close
    all of them; after close the losing, withdrawn and cancelled ones, for good."""
    return ~Q(**{f"{prefix}status": SealedBid.Status.WON,
                 f"{prefix}auction__status": Auction.Status.CLOSED})


def sealed_hold_ids():
    """The ids of the holds of sealed bids (settlement.sealed's source): their amounts
    are price × GPUs × hours."""
    return SealedBid.objects.filter(sealed_bid_q()).values("hold_id")
