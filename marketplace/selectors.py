"""Reads that pages, the API and the feed share: a user's leases, sealed bids as a viewer
may see them, an auction's public bid count and awards.

Sealed bids (DESIGN invariant 4): `visible_bids` is the one statement of whose bid figures
a viewer sees — its own, always; anyone's winning bid of a closed auction (public, shown
as an anonymous award); nothing else. Every read of bid figures outside
marketplace/auctions.py goes through it; `sealed_bid_q` is the rest (the admin's masking).
"""

from __future__ import annotations

from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from marketplace.env_templates import cuda_ok
from marketplace.models import Auction, Interconnect, Lease, Order, SealedBid


def user_leases(user_id: int) -> QuerySet[Lease]:
    """The leases where user `user_id` is the buyer or the provider (unordered; callers
    add ordering, related loads and status filters)."""
    return Lease.objects.filter(Q(buyer_id=user_id) | Q(provider_id=user_id))


def public_bid_q(prefix: str = "") -> Q:
    """The sealed bids whose figures are public (for `SealedBid`, or through `prefix`,
    e.g. "sealed_bid__"): the winning bids of closed auctions."""
    return Q(**{f"{prefix}status": SealedBid.Status.WON,
                f"{prefix}auction__status": Auction.Status.CLOSED})


def sealed_bid_q(prefix: str = "") -> Q:
    """The sealed bids whose figures stay secret (for `SealedBid`, or through `prefix`,
    e.g. "sealed_bid__"): every bid but a winning bid of a closed auction — before close
    all of them; after close the losing, withdrawn and cancelled ones, for good."""
    return ~public_bid_q(prefix)


def visible_bids(viewer_id: int | None) -> QuerySet[SealedBid]:
    """The sealed bids whose figures (price, GPUs, awards) user `viewer_id` may see: its
    own, at any time, and the public ones (public_bid_q). None: an anonymous viewer, who
    sees the public ones only."""
    q = public_bid_q()
    if viewer_id is not None:
        q |= Q(bidder_id=viewer_id)
    return SealedBid.objects.filter(q)


def own_bids(bidder_id: int) -> QuerySet[SealedBid]:
    """User `bidder_id`'s own sealed bids, of every status (unordered)."""
    return visible_bids(bidder_id).filter(bidder_id=bidder_id)


def awards(auction: Auction) -> QuerySet[SealedBid]:
    """The winning bids of `auction` once it closed — none before (unordered). Callers show
    them anonymously: GPUs awarded and price paid, never the bidder."""
    return visible_bids(None).filter(auction=auction)


def bid_count(auction: Auction) -> int:
    """The public count of an auction's bids: the active ones while it is open, then every
    bid but the withdrawn ones."""
    if auction.status == Auction.Status.OPEN:
        return auction.bids.filter(status=SealedBid.Status.ACTIVE).count()
    return auction.bids.exclude(status=SealedBid.Status.WITHDRAWN).count()


def sealed_hold_ids():
    """The ids of the holds of sealed bids (settlement.sealed's source): their amounts
    are price × GPUs × hours."""
    return SealedBid.objects.filter(sealed_bid_q()).values("hold_id")


def ask_node_cudas(market_id: int) -> list[str]:
    """The CUDA version of each node with a standing ask in market `market_id` (one entry
    per node; "" when it reported none)."""
    rows = (Order.objects.filter(market_id=market_id, side=Order.Side.ASK,
                                 status__in=Order.ACTIVE)
            .order_by().values_list("node_id", "node__cuda_version").distinct())
    return [cuda for _, cuda in rows]


def cuda_note(min_cuda: str, cudas: list[str]) -> str:
    """"needs CUDA 12.4: 0 of 3 nodes with asks qualify" for node versions `cudas`."""
    ok = sum(cuda_ok(c, min_cuda) for c in cudas)
    return f"needs CUDA {min_cuda}: {ok} of {len(cudas)} nodes with asks qualify"


def cuda_match_note(order, known: dict[int, list[str]] | None = None) -> str | None:
    """Why a resting bid with a min_cuda may not fill (cuda_note over its market's nodes
    with asks), or None: another order, one not resting, or one that needs no CUDA.
    known: ask_node_cudas by market id, read once per market of a list and kept there."""
    if (order.side != Order.Side.BID or not order.min_cuda
            or order.status not in Order.ACTIVE or order.remaining_gpus <= 0):
        return None
    known = {} if known is None else known
    if order.market_id not in known:
        known[order.market_id] = ask_node_cudas(order.market_id)
    return cuda_note(order.min_cuda, known[order.market_id])


def crossed_note(market_id: int, best_ask: int | None) -> str:
    """Why bids at or above the best ask (micro-USD) rest, "" when none does: what they
    need that no offer meets — "bids at or above the best ask rest: they need CUDA 12.4 /
    NVLink that no offer meets". Needs named: a min_cuda, NVLink, more GPUs on one node
    (gang) than any ask offers, a node with Docker (a bid without a command, while some
    ask's node runs processes); else "their terms"."""
    if best_ask is None:
        return ""
    now = timezone.now()
    active = Order.objects.filter(market_id=market_id, status__in=Order.ACTIVE,
                                  remaining_gpus__gt=0).exclude(
        Q(expires_at__lte=now) | Q(available_until__lte=now))
    rows = set(active.filter(side=Order.Side.BID, price__gte=best_ask).order_by()
               .values_list("min_cuda", "interconnect", "gang_size", "remaining_gpus"))
    if not rows:
        return ""
    widest = active.filter(side=Order.Side.ASK).aggregate(m=Max("remaining_gpus"))["m"] or 0
    needs = sorted({f"CUDA {c}" for c, _, _, _ in rows if c},
                   key=lambda n: tuple(int(x) for x in n[5:].split(".")))
    if any(i == Interconnect.NVLINK for _, i, _, _ in rows):
        needs.append("NVLink")
    gang = max((g or left) for _, _, g, left in rows)
    if gang > widest:
        needs.append(f"{gang} GPUs on one node")
    crossed = active.filter(side=Order.Side.BID, price__gte=best_ask)
    if (crossed.filter(Q(command__isnull=True) | Q(command=[])).exists()
            and active.filter(side=Order.Side.ASK, node__runtime="process").exists()):
        needs.append("a node with Docker (no command given)")  # marketplace/runtimes.py
    what = f"they need {' / '.join(needs)} that no offer meets" if needs else \
        "their terms (expiry, gang size, nodes) meet no offer"
    return f"bids at or above the best ask rest: {what}"
