"""The offers behind a market's book: one row per standing ask, with what tells them
apart (node, provider, measured vs datasheet BF16 TFLOPS, reliability, driver/CUDA,
interconnect, GPUs free, price, available until), filtered and sorted as the market
page and GET /api/v1/gpu-classes/<slug>/offers/ ask (query parameters: FILTERS, SORTS).

Units: prices integer micro-USD per GPU-hour; TFLOPS exact decimals (the node's median
of its healthy GPUs' latest passed benchmarks, providers/benchmarks.py). Bad parameters:
InvalidInput naming the parameter."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from marketplace import maintenance
from marketplace.env_templates import cuda_key, node_cuda, parse_min_cuda
from marketplace.errors import Conflict, InvalidInput
from marketplace.interconnect import describe_gpus, interconnect_words
from marketplace.models import GpuClass, Order
from providers.benchmarks import latest_results
from providers.models import Gpu, Node
from settlement.money import MoneyFormatError, parse_usd

LIMIT = 200  # asks read per market (cheapest first)
FILTERS = ("min_gpus", "max_price", "min_cuda", "min_tflops", "provider")
SORTS = {  # sort parameter → the row's key (None last whichever the direction)
    "price": "price", "gpus": "gpus_free", "cuda": "cuda_key", "tflops": "measured_tflops",
    "available_until": "available_until", "provider": "provider_key", "node": "node_key",
    "reliability": "reliability",
}
PARAMS = (*FILTERS, "sort")


@dataclass(frozen=True)
class Filters:
    """Parsed query parameters; None: not given. max_price in micro-USD per GPU-hour;
    min_cuda as cuda_key; provider compared case-insensitively to its display name."""

    min_gpus: int | None = None
    max_price: int | None = None
    min_cuda: int | None = None
    min_tflops: Decimal | None = None
    provider: str | None = None
    sort: str = "price"


def parse(query: Mapping[str, str]) -> Filters:
    """Filters from a query string ({name: value}); InvalidInput naming the parameter for
    an unknown one, an empty or malformed value, an unknown sort."""
    for name in query:
        if name not in PARAMS:
            raise InvalidInput(f"unknown parameter; the offers take {', '.join(PARAMS)}",
                               field=name)
    out: dict = {}
    for name, value in query.items():
        if value == "":
            continue  # an empty form field: no filter
        if name == "min_gpus":
            if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 4096:
                raise InvalidInput("must be a whole number of GPUs from 1 to 4096", field=name)
            out[name] = int(value)
        elif name == "max_price":
            try:
                out[name] = parse_usd(value)
            except MoneyFormatError as exc:
                raise InvalidInput(str(exc), field=name) from None
        elif name == "min_cuda":
            try:
                major, minor = parse_min_cuda(value)
            except InvalidInput as exc:
                raise InvalidInput(exc.message, field=name) from None
            out[name] = major * 1000 + minor
        elif name == "min_tflops":
            try:
                tflops = Decimal(value)
            except InvalidOperation:
                tflops = None
            if (tflops is None or not tflops.is_finite() or tflops < 0 or not value.isascii()
                    or not value.replace(".", "", 1).isdigit()):
                raise InvalidInput('must be a plain decimal of TFLOPS such as "700"',
                                   field=name)
            out[name] = tflops
        elif name == "provider":
            if len(value) > 100:
                raise InvalidInput("must be at most 100 characters", field=name)
            out[name] = value.strip().casefold()
        elif name == "sort":
            if value.removeprefix("-") not in SORTS:
                raise InvalidInput("must be one of " + ", ".join(SORTS) + " (a leading - "
                                   "sorts high first)", field=name)
            out[name] = value
    return Filters(**out)


def _median(values: list[Decimal]) -> Decimal | None:
    return statistics.median(values) if values else None


def offer_rows(market: GpuClass) -> list[dict]:
    """Every standing ask of `market` with GPUs left, cheapest first (at most LIMIT):
    {"ask": id, "price": micro-USD per GPU-hour, "gpus_free", "available_until",
    "node": {"id", "name"}, "provider": display name, "driver_version", "cuda_version",
    "cuda_key", "interconnect" (topology words; "" for a lone GPU), "summary" ("8 × H100
    SXM 80GB, NVLink full mesh": interconnect.describe_gpus), "node_gpus",
    "measured_tflops" (Decimal or None), "datasheet_tflops" (Decimal or None),
    "reliability" (Node.reliability, 30 days, marketplace/reliability.py; None: no record
    yet), "maintenance": [{starts_at, ends_at}] its node's announced windows not over yet
    (marketplace/maintenance.py)}."""
    asks = list(Order.objects.filter(market=market, side=Order.Side.ASK,
                                     status__in=Order.ACTIVE, remaining_gpus__gt=0)
                .select_related("node__provider").order_by("price", "pk")[:LIMIT])
    nodes = {a.node_id for a in asks}
    gpus = Gpu.objects.filter(node_id__in=nodes, gpu_class=market).select_related("gpu_class")
    by_node: dict[int, list[Gpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    measured: dict[int, list[Decimal]] = {}
    healthy = {g.pk: g.node_id for g in gpus if g.healthy}
    for gpu_id, result in latest_results(gpus.filter(healthy=True)).items():
        if result.correct and result.bf16_tflops is not None and gpu_id in healthy:
            measured.setdefault(healthy[gpu_id], []).append(result.bf16_tflops)
    windows = maintenance.upcoming(nodes)  # announced windows not over yet
    rows = []
    for a in asks:
        node = a.node
        rows.append({
            "ask": a.pk, "price": a.price, "gpus_free": a.remaining_gpus,
            "available_until": a.available_until,
            "node": {"id": node.pk, "name": node.name},
            "provider": node.provider.display_name,
            "driver_version": node.driver_version, "cuda_version": node.cuda_version,
            "cuda_key": cuda_key(node.cuda_version),
            "interconnect": interconnect_words(by_node.get(node.pk, [])),
            "summary": describe_gpus(by_node.get(node.pk, [])),
            "node_gpus": len(by_node.get(node.pk, [])),
            "measured_tflops": _median(measured.get(node.pk, [])),
            "datasheet_tflops": market.bf16_dense_tflops,
            "reliability": node.reliability,
            "maintenance": [{"starts_at": w.starts_at, "ends_at": w.ends_at}
                            for w in windows.get(node.pk, [])],
            "provider_key": node.provider.display_name.casefold(),
            "node_key": node.name.casefold(),
        })
    return rows


def select(rows: list[dict], filters: Filters) -> list[dict]:
    """The rows that pass `filters`, in its sort (ties: price, then the older ask). A row
    without the sorted figure (no benchmark, no CUDA) goes last either way; a min_tflops
    or min_cuda filter drops it."""
    f = filters
    out = [r for r in rows
           if (f.min_gpus is None or r["gpus_free"] >= f.min_gpus)
           and (f.max_price is None or r["price"] <= f.max_price)
           and (f.min_cuda is None or (node_cuda(r["cuda_version"]) is not None
                                       and r["cuda_key"] >= f.min_cuda))
           and (f.min_tflops is None or (r["measured_tflops"] is not None
                                         and r["measured_tflops"] >= f.min_tflops))
           and (f.provider is None or r["provider_key"] == f.provider)]
    out.sort(key=lambda r: (r["price"], r["ask"]))
    key = SORTS[f.sort.removeprefix("-")]
    descending = f.sort.startswith("-")
    missing = [r[key] is None or (key == "cuda_key" and r[key] == 0) for r in out]
    known = [r for r, m in zip(out, missing, strict=True) if not m]
    unknown = [r for r, m in zip(out, missing, strict=True) if m]
    known.sort(key=lambda r: r[key], reverse=descending)  # stable: ties keep price order
    return known + unknown


def offers(market: GpuClass, query: Mapping[str, str]) -> tuple[Filters, list[dict]]:
    """(the parsed filters, the rows they select) of a query string; InvalidInput as parse."""
    filters = parse(query)
    return filters, select(offer_rows(market), filters)


def until_text(at: datetime) -> str:
    """"2026-12-02 14:00 UTC" (available until, as the page shows it)."""
    return at.strftime("%Y-%m-%d %H:%M UTC")


def check_bid_node(node_id: int, market: GpuClass, gang: int) -> None:
    """A bid for one node (`node`): InvalidInput naming `node` when no such node has
    GPUs of `market`; Conflict naming `node` when its gang is larger than the node's
    GPUs of the class (it could never fill). Whether the node offers them now is not
    asked: the bid rests until it does (or its time in force ends it)."""
    if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id <= 0:
        raise InvalidInput("must be a node id", field="node")
    units = Gpu.objects.filter(node_id=node_id, gpu_class=market).count()
    if not units:
        name = Node.objects.filter(pk=node_id).values_list("name", flat=True).first()
        where = f"node {name}" if name else f"no node {node_id} with GPUs"
        raise InvalidInput(f"{where} has no GPUs of {market.slug}" if name
                           else f"{where} of {market.slug}", field="node")
    if gang > units:
        raise Conflict(f"a gang of {gang} runs on one node, and this node has {units} "
                       f"GPUs of {market.slug}", field="node")
