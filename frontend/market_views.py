"""The market page (/markets/<slug>/): datasheet and measured figures, the depth chart,
the offers behind the book, price history, templates and the bid form (PRG: a placed bid
redirects back to the page; a refused one is shown next to its field, 400)."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse

from frontend import forms as f
from frontend.views import (
    LOGIN,
    _lease_rows,
    _order_rows,
    _page,
    _rows_json,
    _service_error,
    container_terms,
    usd,
)
from marketplace import book, env_templates, interconnect, selectors
from marketplace.catalog import slice_label
from marketplace.errors import MarketError
from marketplace.models import Fill, GpuClass, Lease, Order
from providers.benchmarks import class_summary
from settlement import services as ledger


def template_compatibility(market: GpuClass) -> list[dict]:
    """Per template of the catalog: {id, title, image, ports ("22 ssh, 8888 jupyter"),
    min_cuda, note: "needs CUDA 12.4: 3 of 5 nodes with asks qualify" (or, with no
    need, "runs on any node")} over the market's nodes with standing asks."""
    cudas = selectors.ask_node_cudas(market.pk)
    return [{"id": t.id, "title": t.title, "image": t.image or "your own",
             "ports": ", ".join(f"{p} {r}" for p, r in t.ports) or "—",
             "min_cuda": t.min_cuda,
             "note": selectors.cuda_note(t.min_cuda, cudas) if t.min_cuda
             else f"runs on any node ({len(cudas)} with asks)"}
            for t in env_templates.templates().values()]


def _depth_rows(levels):
    return [[usd(p), q] for p, q in levels]


def _market_context(request, market: GpuClass, form):
    bids, asks = book.depth(market)
    trades = [{"id": x.pk, "price": usd(x.price), "gpus": x.gpus,
               "at": x.created_at.isoformat()}
              for x in Fill.objects.filter(market=market).order_by("-pk")[:20]]
    ctx = {
        "market": market, "form": form,
        "reference": usd(market.reference_price) if market.reference_price else None,
        "bids": _depth_rows(bids), "asks": _depth_rows(asks),
        "depth_json": _rows_json({"bids": _depth_rows(bids), "asks": _depth_rows(asks)}),
        "trades": trades, "trades_json": _rows_json(trades),
        "best_bid": usd(bids[0][0]) if bids else None,
        "best_ask": usd(asks[0][0]) if asks else None,
        "crossed": selectors.crossed_note(market.pk, asks[0][0]) if bids and asks
        and bids[0][0] >= asks[0][0] else "",
        "gpus_offered": sum(q for _, q in asks),
        "markets": GpuClass.objects.all(),
        "benchmark": class_summary(market),  # None: "not benchmarked yet"
        "slice": slice_label(market),  # "1/7 of an H100: 10 GB, 16 SMs"; "" for a whole GPU
        "slice_markets": [(c, slice_label(c)) for c in
                          market.slices.select_related("parent").order_by("memory_gb", "slug")],
        "templates": template_compatibility(market),
        "offers": [{**o, "price": usd(o["price"])} for o in interconnect.offers(market)],
    }
    if request.user.is_authenticated:
        ctx["my_orders"] = _order_rows(Order.objects.filter(owner=request.user, market=market)
                                       .select_related("market", "node").order_by("-pk")[:20])
        ctx["my_leases"] = _lease_rows(Lease.objects.filter(buyer=request.user, market=market)
                                       .select_related("market", "node").order_by("-pk")[:20],
                                       role="buyer")
    return ctx


def market(request, slug: str):
    gpu_class = get_object_or_404(GpuClass, slug=slug)
    form = f.BidForm(request.POST or None)
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect(f"{reverse(LOGIN)}?next={request.path}")
        if form.is_valid():
            v = form.cleaned_data
            try:
                placed = book.place_bid(
                    buyer_id=request.user.pk, market_slug=slug, price=v["price"],
                    gpus=v["gpus"], duration_seconds=v["hours"] * 3600,
                    gang_size=v["gang_size"], time_in_force=v["time_in_force"],
                    interconnect=v["interconnect"] or "any", **container_terms(v))
            except (MarketError, ledger.SettlementError) as exc:
                _service_error(form, exc)
            else:
                order = placed.order
                order.refresh_from_db()
                filled = order.gpus - order.remaining_gpus
                messages.success(request, f"Bid #{order.pk} placed: {order.status}, "
                                          f"{filled} of {order.gpus} GPUs filled, "
                                          f"{len(placed.leases)} lease(s).")
                return redirect("market", slug=slug)
        return _page(request, "frontend/market.html",
                     _market_context(request, gpu_class, form), status=400)
    return _page(request, "frontend/market.html", _market_context(request, gpu_class, form))


