"""The feed's messages and snapshots, read from the rows (shapes: docs/FEED_PROTOCOL.md).
Money as decimal USD strings, times ISO 8601 UTC; never a sealed bid's content outside its
bidder's own feed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from frontend.feed.protocol import DEPTH_LEVELS, LAST_TRADES
from marketplace import book, selectors
from marketplace.connect import connect_info
from marketplace.models import Fill, Lease, Order, SealedBid
from marketplace.ports import endpoint_text
from settlement import services as ledger
from settlement.money import format_usd


def _usd(micros: int | None) -> str | None:
    return None if micros is None else format_usd(micros)


def _iso(dt) -> str | None:
    return None if dt is None else dt.isoformat()


def _levels(levels: Iterable[tuple[int, int]]) -> list[list[Any]]:
    return [[_usd(price), gpus] for price, gpus in levels]


def depth_payload(market) -> dict[str, Any]:
    bids, asks = book.depth(market, levels=DEPTH_LEVELS)
    return {
        "market": market.slug, "bids": _levels(bids), "asks": _levels(asks),
        "best_bid": _usd(bids[0][0]) if bids else None,
        "best_ask": _usd(asks[0][0]) if asks else None,
    }


def trade_payload(fill) -> dict[str, Any]:
    """Anonymous: price, GPUs, time (and the fill id, for de-duplication). Never who."""
    return {"id": fill.pk, "price": _usd(fill.price), "gpus": fill.gpus,
            "at": _iso(fill.created_at)}


def market_snapshot(market) -> dict[str, Any]:
    trades = [trade_payload(f) for f in Fill.objects.filter(market=market).order_by("-pk")
              [:LAST_TRADES]]
    return {"type": "snapshot", "feed": "market", **depth_payload(market), "trades": trades}


def auction_payload(auction) -> dict[str, Any]:
    """Public state of a sealed-bid auction: the count of active bids and the clock.
    After close: the clearing price and the anonymous awards. Never a bid's content
    before close (DESIGN invariant 4)."""
    now = timezone.now()
    data: dict[str, Any] = {
        "auction": auction.pk, "market": auction.market.slug, "status": auction.status,
        "rule": auction.rule, "gpus": auction.gpus,
        "reserve_price": _usd(auction.reserve_price),
        "duration_seconds": auction.duration_seconds,
        "closes_at": _iso(auction.closes_at),
        "seconds_left": max(0, int((auction.closes_at - now).total_seconds())),
        "server_time": _iso(now),
    }
    if auction.status == "open":
        data["type"] = "auction"
        data["bids"] = auction.bids.filter(status=SealedBid.Status.ACTIVE).count()
    else:
        data["bids"] = auction.bids.filter(
            status__in=[SealedBid.Status.WON, SealedBid.Status.LOST]).count()
        data["type"] = "auction_result"
        data["clearing_price"] = _usd(auction.clearing_price)
        data["closed_at"] = _iso(auction.closed_at)
        data["awards"] = [
            {"gpus": gpus, "price": _usd(price)}
            for gpus, price in selectors.awards(auction)
            .order_by("-paid_price", "pk").values_list("awarded_gpus", "paid_price")
        ]
    return data


def market_summary_payload(market) -> dict[str, Any]:
    """A market's line on the home page: best bid and ask, GPUs offered (in the depth's
    levels)."""
    return summary_of_depth(depth_payload(market))


def summary_of_depth(depth: dict[str, Any]) -> dict[str, Any]:
    return {"market": depth["market"], "best_bid": depth["best_bid"],
            "best_ask": depth["best_ask"],
            "gpus_offered": sum(gpus for _, gpus in depth["asks"])}


def auction_summary_payload(auction) -> dict[str, Any]:
    """An auction's line in the lists: status, public bid count, clock, clearing price."""
    return {"type": "auction_summary", "auction": auction.pk, "market": auction.market.slug,
            "status": auction.status, "bids": selectors.bid_count(auction),
            "closes_at": _iso(auction.closes_at),
            "clearing_price": _usd(auction.clearing_price)}


def summary_snapshot() -> dict[str, Any]:
    """The markets with a resting order and the open auctions."""
    from marketplace.models import Auction, GpuClass

    trading = Order.objects.filter(status__in=Order.ACTIVE, remaining_gpus__gt=0) \
        .values_list("market_id", flat=True).distinct()
    markets = GpuClass.objects.filter(pk__in=trading).order_by("slug")
    auctions = Auction.objects.filter(status="open").select_related("market").order_by("pk")
    return {"type": "snapshot", "feed": "summary",
            "markets": [market_summary_payload(m) for m in markets],
            "auctions": [auction_summary_payload(a) for a in auctions]}


def auction_snapshot(auction) -> dict[str, Any]:
    return {**auction_payload(auction), "type": "snapshot", "feed": "auction",
            "event": auction_payload(auction)["type"]}


def order_payload(order) -> dict[str, Any]:
    return {"id": order.pk, "market": order.market.slug, "side": order.side,
            "status": order.status, "price": _usd(order.price), "gpus": order.gpus,
            "remaining_gpus": order.remaining_gpus, "time_in_force": order.time_in_force,
            "created_at": _iso(order.created_at)}


def sealed_bid_payload(bid) -> dict[str, Any]:
    """A sealed bid as its own bidder sees it (only ever sent to user.<bidder>)."""
    return {"id": bid.pk, "auction": bid.auction_id, "status": bid.status,
            "price": _usd(bid.price), "gpus": bid.gpus, "min_gpus": bid.min_gpus,
            "awarded_gpus": bid.awarded_gpus, "paid_price": _usd(bid.paid_price),
            "created_at": _iso(bid.created_at)}


def lease_payload(lease, role: str) -> dict[str, Any]:
    return {"id": lease.pk, "market": lease.market.slug, "role": role,
            "status": lease.status, "gpus": lease.gpu_count, "price": _usd(lease.price),
            "duration_seconds": lease.duration_seconds, "node": lease.node.name,
            "started_at": _iso(lease.started_at), "ends_at": _iso(lease.ends_at),
            "ended_at": _iso(lease.ended_at), "cause": lease.cause,
            "progress": lease.progress, "cost": _usd(lease.cost),
            "provider_amount": _usd(lease.provider_amount),
            "platform_fee": _usd(lease.platform_fee),
            "interruptible": lease.interruptible, "preempt_at": _iso(lease.preempt_at),
            "ports": list(lease.ports or []),
            "endpoints": [{**e, "address": endpoint_text(e)} for e in lease.endpoints or []],
            # how to connect: the buyer's only (the provider's message has null)
            "connect": connect_info(lease) if role == "buyer" else None}


def wallet_payload(user_id: int) -> dict[str, Any]:
    return wallet_payloads([user_id])[user_id]


def wallet_payloads(user_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """wallet_payload of several users, read in one query."""
    return {u: {"available": _usd(w.available), "held": _usd(w.held), "earned": _usd(w.earned)}
            for u, w in ledger.wallets(user_ids=user_ids).items()}


def me_snapshot(user_id: int) -> dict[str, Any]:
    orders = Order.objects.filter(owner_id=user_id, status__in=Order.ACTIVE) \
        .select_related("market").order_by("pk")
    bids = selectors.own_bids(user_id).filter(status=SealedBid.Status.ACTIVE).order_by("pk")
    leases = selectors.user_leases(user_id) \
        .exclude(status__in=Lease.ENDED).select_related("market", "node").order_by("pk")
    return {
        "type": "snapshot", "feed": "me", "user": user_id, "wallet": wallet_payload(user_id),
        "orders": [order_payload(o) for o in orders],
        "sealed_bids": [sealed_bid_payload(b) for b in bids],
        "leases": [lease_payload(le, "buyer" if le.buyer_id == user_id else "provider")
                   for le in leases],
    }
