"""What one transaction changed (`Batch`, noted by frontend/signals.py through `note`),
handed to the publisher after commit and read into messages there. docs/FEED_PROTOCOL.md,
Publishing."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core import after_commit
from frontend.feed.payloads import (
    auction_payload,
    auction_summary_payload,
    lease_payload,
    order_payload,
    sealed_bid_payload,
    trade_payload,
    wallet_payloads,
)
from frontend.feed.protocol import SUMMARY_GROUP, auction_group, market_group, user_group
from frontend.feed.publisher import publisher
from marketplace import telemetry
from marketplace.models import Auction, Fill, GpuClass, Lease, Order, SealedBid
from settlement.models import Posting

log = logging.getLogger("gpumarket.feed")


@dataclass
class Batch:
    """What changed in one transaction; handed to the publisher thread after commit."""

    markets: set[int] = field(default_factory=set)
    fills: set[int] = field(default_factory=set)
    auctions: set[int] = field(default_factory=set)
    orders: set[int] = field(default_factory=set)
    sealed_bids: set[int] = field(default_factory=set)
    leases: set[int] = field(default_factory=set)
    entries: set[int] = field(default_factory=set)
    telemetry: set[int] = field(default_factory=set)  # leases with new readings
    order_owners: dict[int, int] = field(default_factory=dict)  # order id → its owner's id
    committed_at: float = 0.0

    FIELDS = ("markets", "fills", "auctions", "orders", "sealed_bids", "leases", "entries",
              "telemetry", "order_owners")

    def __call__(self) -> None:  # the on_commit callback: cheap, no reads, no I/O
        self.committed_at = time.time()
        try:
            publisher().submit(self)
        except Exception:  # the data is committed; a feed outage must not fail the caller
            log.exception("live feed: queueing after commit failed; clients resync")

    def merge(self, other: Batch) -> None:
        for name in self.FIELDS:
            getattr(self, name).update(getattr(other, name))
        self.committed_at = min(self.committed_at, other.committed_at)

    def messages(self, listening: Listening = None
                 ) -> list[tuple[str, dict[str, Any], int | None]]:
        """(group, payload, user id for user groups) in publishing order, read after
        commit. Rows that no longer exist (rolled back in a savepoint) are skipped. A
        market's depth is a placeholder `{"type": "depth", "_depth_of": market}`, read
        when it is published (see Publisher). `listening`: the users whose order,
        balance and metrics messages are wanted: a set, or a function asked with the
        users concerned (their ids read first) that returns those wanted (the
        publisher's: `counter().listening_among`); None: every user's."""
        out: list[tuple[str, dict[str, Any], int | None]] = []
        if self.fills:
            fills = Fill.objects.filter(pk__in=self.fills).select_related("market") \
                .order_by("pk")
            for fill in fills:
                out.append((market_group(fill.market.slug),
                            {"type": "trade", "market": fill.market.slug,
                             **trade_payload(fill)}, None))
        if self.markets:
            for market in GpuClass.objects.filter(pk__in=self.markets).order_by("pk"):
                out.append((market_group(market.slug),
                            {"type": "depth", "_depth_of": market}, None))
        if self.auctions:
            for auction in Auction.objects.filter(pk__in=self.auctions) \
                    .select_related("market"):
                out.append((auction_group(auction.pk), auction_payload(auction), None))
                out.append((SUMMARY_GROUP, auction_summary_payload(auction), None))
        orders = Order.objects.filter(pk__in=self.orders)
        if not self.orders:
            wanted = set()
        elif callable(listening) and self.orders <= self.order_owners.keys():
            # the owners were noted with the orders: nothing read for users no one hears
            owners = {self.order_owners[pk] for pk in self.orders}
            wanted = listening(owners)
        else:
            wanted = _wanted(listening, orders, "owner_id")
        if wanted is not None:  # nobody else would receive them: not even read
            orders = orders.filter(owner_id__in=wanted)
        if self.orders and wanted != set():
            for order in orders.select_related("market").order_by("pk"):
                out.append((user_group(order.owner_id),
                            {"type": "order", "order": order_payload(order)}, order.owner_id))
        if self.sealed_bids:
            for bid in SealedBid.objects.filter(pk__in=self.sealed_bids).order_by("pk"):
                out.append((user_group(bid.bidder_id),
                            {"type": "sealed_bid", "bid": sealed_bid_payload(bid)},
                            bid.bidder_id))
        if self.leases:
            for lease in Lease.objects.filter(pk__in=self.leases) \
                    .select_related("market", "node").order_by("pk"):
                for user_id, role in ((lease.buyer_id, "buyer"),
                                      (lease.provider_id, "provider")):
                    out.append((user_group(user_id),
                                {"type": "lease", "lease": lease_payload(lease, role)},
                                user_id))
        if self.telemetry:
            leases = Lease.objects.filter(pk__in=self.telemetry)
            wanted = _wanted(listening, leases, "buyer_id")
            if wanted != set():
                out.extend(_telemetry_messages(leases, wanted))
        # accounts without an owner (platform, external) are not published
        postings = Posting.objects.filter(entry_id__in=self.entries,
                                          account__owner__isnull=False)
        wanted = _wanted(listening, postings, "account__owner_id") if self.entries \
            else set()
        if wanted != set():
            per_user: dict[int, dict[int, str]] = defaultdict(dict)
            if wanted is not None:
                postings = postings.filter(account__owner_id__in=wanted)
            rows = postings \
                .values_list("account__owner_id", "entry_id", "entry__kind")
            for owner_id, entry_id, kind in rows:
                per_user[owner_id][entry_id] = kind
            wallets = wallet_payloads(per_user)
            for user_id in sorted(per_user):
                entries = [{"id": e, "kind": k} for e, k in sorted(per_user[user_id].items())]
                out.append((user_group(user_id), {"type": "balance", "entries": entries,
                                                   "wallet": wallets[user_id]}, user_id))
        return out


Listening = set[int] | Callable[[set[int]], set[int]] | None


def _wanted(listening: Listening, rows, user_field: str) -> set[int] | None:
    """The users of `rows` (a queryset; only `user_field` is read) whose messages are
    wanted; None: every user's."""
    if listening is None:
        return None
    if callable(listening):
        users = set(rows.order_by().values_list(user_field, flat=True).distinct())
        return listening(users) if users else set()
    return set(listening)


def _telemetry_messages(leases, listening: set[int] | None):
    """`lease_metrics` for each lease's buyer only (docs/FEED_PROTOCOL.md): its GPUs'
    newest 10 s bucket and its idle state."""
    leases = leases.order_by("pk")
    if listening is not None:
        leases = leases.filter(buyer_id__in=listening)
    leases = list(leases)
    newest = telemetry.latest([lease.pk for lease in leases])
    idle = telemetry.idle_states(leases)
    for lease in leases:
        if lease.pk in newest:
            yield (user_group(lease.buyer_id),
                   {"type": "lease_metrics", "lease": lease.pk, **newest[lease.pk],
                    "idle": idle.get(lease.pk)}, lease.buyer_id)


def current_batch() -> Batch | None:
    """The batch already registered with the current transaction's on_commit callbacks,
    if any. Looked up among the callbacks themselves, so a rolled-back savepoint that
    registered it takes it away with it (no stale state to clean up)."""
    return after_commit.registered(Batch)


def batch() -> Batch:
    """The batch of the current transaction, registering it with on_commit on first use.
    Outside a transaction (autocommit) a fresh batch is flushed by the caller."""
    return after_commit.collector(Batch)


def note(**changes: int | tuple[int, int]) -> None:
    """Record changed rows (markets=, fills=, auctions=, orders=, sealed_bids=, leases=,
    entries=, telemetry= ids; order_owners= an (order id, owner id) pair) in the current
    transaction's batch; published after commit."""

    def add(b: Batch) -> None:
        for name, pk in changes.items():
            if name == "order_owners":
                b.order_owners[pk[0]] = pk[1]
            else:
                getattr(b, name).add(pk)

    after_commit.note(Batch, add)


def note_many(**changes: list[int]) -> None:
    """note() of many ids of each kind at once (entries=[…]): one look-up of the batch."""

    def add(b: Batch) -> None:
        for name, pks in changes.items():
            getattr(b, name).update(pks)

    after_commit.note(Batch, add)
