"""The market page (/markets/<slug>/): datasheet and measured figures, the depth chart,
the offers behind the book, price history, templates and the bid form (PRG: a placed bid
redirects back to the page; a refused one is shown next to its field, 400)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse

from core.image_ref import image_reference_problem
from frontend import forms as f
from frontend.templatetags import gpumarket as money
from frontend.views import (
    LOGIN,
    _lease_rows,
    _order_rows,
    _page,
    _rows_json,
    _service_error,
    bid_terms,
    container_terms,
    usd,
)
from marketplace import book, env_templates, offers, price_history, runtimes, selectors
from marketplace.catalog import slice_label
from marketplace.errors import InvalidInput, MarketError
from marketplace.models import Fill, GpuClass, Lease, Order
from providers import node_images
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


OFFER_COLUMNS = [  # (sort key or "", heading), in the table's order
    ("node", "Node"), ("provider", "Provider"), ("tflops", "BF16 TFLOPS measured / datasheet"),
    ("reliability", "Reliability (30 days)"), ("cuda", "Driver / CUDA"),
    ("", "GPUs and interconnect"),
    ("gpus", "GPUs free"), ("price", "Price"), ("available_until", "Available until"),
]


def offer_view(row: dict) -> dict:
    """An offers.offer_rows row as the page and market.js show it (strings)."""
    def tflops(v):
        return "—" if v is None else f"{v.normalize():f}"
    return {"ask": row["ask"], "node_id": row["node"]["id"], "node": row["node"]["name"],
            "provider": row["provider"], "measured": tflops(row["measured_tflops"]),
            "datasheet": tflops(row["datasheet_tflops"]),
            # the node's 30-day record (marketplace/reliability.py); "new": none yet
            "reliability": "new" if row["reliability"] is None else str(row["reliability"]),
            "driver": row["driver_version"] or "—", "cuda": row["cuda_version"] or "—",
            "interconnect": row["summary"] or "—", "gpus_free": row["gpus_free"],
            "price": money.price(row["price"]),  # "$2.865 /GPU-h"
            "until": offers.until_text(row["available_until"]),
            "maintenance": "; ".join(
                f"{w['starts_at']:%Y-%m-%d %H:%M} – {w['ends_at']:%Y-%m-%d %H:%M} UTC"
                for w in row.get("maintenance", []))}


def _offers_context(request, market: GpuClass) -> dict:
    """The offers table: the rows the page's query selects (offers.PARAMS; other keys are
    the bid form's), its sort links and, for a bad parameter, the error naming it (then
    every offer, unfiltered)."""
    query = {k: request.GET[k] for k in offers.PARAMS if k in request.GET}
    rows = offers.offer_rows(market)
    try:
        filters, error = offers.parse(query), None
    except InvalidInput as exc:
        filters, error = offers.Filters(), {"field": exc.field, "message": exc.message}
        query = {}
    chosen = offers.select(rows, filters)
    image, image_error, holding = request.GET.get("image", "").strip(), None, set()
    if len(request.GET.getlist("image")) > 1:
        image_error = "is given more than once"
    elif image:
        image_error = image_reference_problem(image)
        if image_error is None:
            holding = node_images.nodes_holding(image, {r["node"]["id"] for r in chosen})
            query["image"] = image
    selected = [{**offer_view(r), "image_cached": r["node"]["id"] in holding,
                 "bid_link": "?" + urlencode({**query, "node": r["node"]["id"]}) + "#bid-h"}
                for r in chosen]
    columns = []
    for key, title in OFFER_COLUMNS:
        link = None
        if key:
            order = f"-{key}" if filters.sort == key else key
            link = "?" + urlencode({**query, "sort": order}) + "#offers-h"
        columns.append({"key": key, "title": title, "link": link,
                        "active": filters.sort.removeprefix("-") == key,
                        "descending": filters.sort.startswith("-")})
    note = (node_images.cached_note(len(holding), len({r["node_id"] for r in selected}))
            if image and image_error is None else "")
    if image_error and error is None:
        error = {"field": "image", "message": image_error}
    return {"offer_rows": selected, "offer_columns": columns, "offer_error": error,
            "offer_image": image if image_error is None else
            "".join(c for c in image if c.isprintable()), "offer_image_note": note,
            "offer_query": query, "offer_sort": filters.sort, "offer_total": len(rows),
            "offer_sorts": [*offers.SORTS, *(f"-{k}" for k in offers.SORTS)],
            "offers_data": selected}


def _history_context(request, market: GpuClass) -> dict:
    """The price history chart's data for ?range= (1h, 24h, 7d; anything else: 24h)."""
    rng = price_history.RANGES.get(request.GET.get("range", ""),
                                   price_history.RANGES[price_history.DEFAULT_RANGE])
    h = price_history.history(market, rng)
    data = {"range": rng.name, "bucket_seconds": h["bucket_seconds"],
            "buckets": [{"t": int(b["start"].timestamp()) * 1000,
                         **{k: None if b[k] is None else usd(b[k])
                            for k in ("open", "high", "low", "close")},
                         "trades": b["trades"], "gpu_hours": price_history.gpu_hours(
                             b["gpu_seconds"])} for b in h["buckets"]]}
    return {"history_range": rng.name, "history_ranges": list(price_history.RANGES),
            "history_trades": sum(b["trades"] for b in h["buckets"]),
            "history_data": data}


def _bid_initial(request, market: GpuClass) -> dict:
    """The bid form's initial values from "Bid for this node": ?node=<id> of a standing
    ask of this market fills in the node, its price and its free GPUs (IOC off: the bid
    rests on that node if the ask is taken meanwhile)."""
    node = request.GET.get("node", "")
    if not node.isascii() or not node.isdigit():
        return {}
    row = (Order.objects.filter(market=market, side=Order.Side.ASK, node_id=int(node),
                                status__in=Order.ACTIVE, remaining_gpus__gt=0)
           .order_by("price", "pk").values("price", "remaining_gpus").first())
    if row is None:
        return {}
    return {"node": int(node), "price": usd(row["price"]), "gpus": row["remaining_gpus"]}


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
        **_offers_context(request, market),
        **_history_context(request, market),
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
    form = f.BidForm(request.POST or None, initial=_bid_initial(request, gpu_class),
                     images=runtimes.market_runs_images(gpu_class.pk),
                     where=f"every node of {gpu_class.slug}")
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
                    interconnect=v["interconnect"] or "any", node=v.get("node"),
                    **bid_terms(v), **container_terms(v))
            except (MarketError, ledger.SettlementError) as exc:
                _service_error(form, exc)
            else:
                order = placed.order
                order.refresh_from_db()
                filled = order.gpus - order.remaining_gpus
                messages.success(request, f"Bid #{order.pk} placed: "
                                          f"{money.status_word(order.status)}, "
                                          f"{filled} of {money.gpus(order.gpus)} filled, "
                                          f"{len(placed.leases)} lease(s).")
                return redirect("market", slug=slug)
        return _page(request, "frontend/market.html",
                     _market_context(request, gpu_class, form), status=400)
    ctx = _market_context(request, gpu_class, form)
    return _page(request, "frontend/market.html", ctx, status=400 if ctx["offer_error"] else 200)


