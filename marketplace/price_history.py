"""A market's trades over time, from its fills: OHLC buckets with volume, for the market
page's chart and GET /api/v1/gpu-classes/<slug>/history/?range=1h|24h|7d.

Buckets are aligned to multiples of their size in UTC epoch seconds (RANGES: 60 × 1 min,
96 × 15 min, 84 × 2 h); the last one holds `now` (so it may still grow). A fill belongs
to the bucket of its created_at, [start, start + size). Within a bucket, open and close
are the first and last fill by (created_at, id). An empty bucket has null prices and
zero volume. Prices: integer micro-USD per GPU-hour (the trade price, the resting
order's); volume: GPUs traded, and GPU-seconds (gpus × the bid's lease length, exact)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from marketplace.errors import InvalidInput
from marketplace.models import Fill, GpuClass


@dataclass(frozen=True)
class Range:
    name: str
    bucket_seconds: int
    buckets: int


RANGES = {r.name: r for r in (Range("1h", 60, 60), Range("24h", 900, 96),
                              Range("7d", 7200, 84))}
DEFAULT_RANGE = "24h"


def parse_range(query: Mapping[str, str]) -> Range:
    """The range a query string asks for (`range`, default 24h); InvalidInput naming
    the parameter for another parameter or value."""
    for name in query:
        if name != "range":
            raise InvalidInput("unknown parameter; the history takes range", field=name)
    value = query.get("range", DEFAULT_RANGE)
    if value not in RANGES:
        raise InvalidInput(f"must be one of {', '.join(RANGES)}", field="range")
    return RANGES[value]


def history(market: GpuClass, rng: Range, *, now: datetime | None = None) -> dict:
    """{"range", "bucket_seconds", "start", "end", "buckets": [{"start", "open", "high",
    "low", "close", "trades", "gpus", "gpu_seconds"}]} of `market` (datetimes aware UTC;
    prices micro-USD per GPU-hour or None)."""
    now = now or timezone.now()
    size = rng.bucket_seconds
    last = int(now.timestamp()) // size * size
    first = last - (rng.buckets - 1) * size
    start = datetime.fromtimestamp(first, UTC)
    end = datetime.fromtimestamp(last + size, UTC)
    buckets = [{"start": start + timedelta(seconds=i * size), "open": None, "high": None,
                "low": None, "close": None, "trades": 0, "gpus": 0, "gpu_seconds": 0}
               for i in range(rng.buckets)]
    fills = (Fill.objects.filter(market=market, created_at__gte=start, created_at__lt=end)
             .order_by("created_at", "pk")
             .values_list("created_at", "price", "gpus", "bid__duration_seconds"))
    for at, price, gpus, seconds in fills.iterator(chunk_size=2000):
        b = buckets[(int(at.timestamp()) - first) // size]
        if b["open"] is None:
            b["open"] = b["high"] = b["low"] = price
        b["high"] = max(b["high"], price)
        b["low"] = min(b["low"], price)
        b["close"] = price
        b["trades"] += 1
        b["gpus"] += gpus
        b["gpu_seconds"] += gpus * (seconds or 0)
    return {"range": rng.name, "bucket_seconds": size, "start": start, "end": end,
            "buckets": buckets}


def gpu_hours(gpu_seconds: int) -> str:
    """GPU-seconds as GPU-hours, a decimal string exact to 6 places, rounded down
    (5400 → "1.5", 1 → "0.000277")."""
    micro = gpu_seconds * 1_000_000 // 3600
    whole, frac = divmod(micro, 1_000_000)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)
