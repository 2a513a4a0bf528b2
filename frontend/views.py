"""Server-rendered pages. The home page lists markets, open auctions (bid count and
time left only: sealed bids stay sealed), recent fills and leases."""

from __future__ import annotations

from django.shortcuts import render
from django.utils import timezone

from marketplace import book
from marketplace.models import Auction, Fill, GpuClass, Lease
from settlement.money import format_usd


def _usd(micros: int | None) -> str:
    return "—" if micros is None else f"${format_usd(micros)}"


def home(request):
    now = timezone.now()
    markets = []
    for market in GpuClass.objects.all():
        bids, asks = book.depth(market, levels=1)
        markets.append({
            "slug": market.slug, "name": market.name, "memory_gb": market.memory_gb,
            "tflops": market.bf16_dense_tflops, "reference": _usd(market.reference_price or None),
            "best_bid": _usd(bids[0][0]) if bids else "—",
            "best_ask": _usd(asks[0][0]) if asks else "—",
            "gpus_offered": sum(q for _, q in asks),
        })
    open_auctions = [
        {"id": a.pk, "market": a.market.slug, "gpus": a.gpus, "rule": a.rule,
         "reserve": _usd(a.reserve_price), "bids": a.bids.filter(status="active").count(),
         "seconds_left": max(0, int((a.closes_at - now).total_seconds()))}
        for a in Auction.objects.filter(status="open").select_related("market")
        .order_by("closes_at")
    ]
    fills = [
        {"id": f.pk, "market": f.market.slug, "gpus": f.gpus, "price": _usd(f.price),
         "at": f.created_at}
        for f in Fill.objects.select_related("market").order_by("-pk")[:20]
    ]
    leases = [
        {"id": lease.pk, "market": lease.market.slug, "gpus": lease.gpu_count,
         "node": lease.node.name, "status": lease.status, "price": _usd(lease.price),
         "cost": _usd(lease.cost)}
        for lease in Lease.objects.select_related("market", "node").order_by("-pk")[:20]
    ]
    return render(request, "frontend/home.html", {
        "markets": markets, "auctions": open_auctions, "fills": fills, "leases": leases,
    })
