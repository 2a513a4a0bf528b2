"""GET /metrics: the Prometheus exposition of every process's metrics (core/metrics.py,
added up from PROMETHEUS_MULTIPROC_DIR) and the market's state read at scrape.

Access (settings GPUMARKET_METRICS_TOKEN, GPUMARKET_METRICS_ALLOW): neither set → 404;
otherwise a peer address in an allowed network, or `Authorization: Bearer <token>`
(compared as SHA-256 digests, constant time); else 401 (token configured) or 403, with a
one-line body naming nothing but what is missing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import time

from django.conf import settings
from django.db.models import Count, Max, Min, Sum
from django.http import Http404, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from core import metrics

_PID = re.compile(r"_(\d+)\.db$")


def _allowed(request) -> bool | None:
    """True: let in; False: refused (token configured: 401); None: refused (403)."""
    token_hash, networks = settings.GPUMARKET_METRICS_TOKEN_SHA256, settings.GPUMARKET_METRICS_ALLOW
    if not token_hash and not networks:
        raise Http404("metrics are off")
    try:
        peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        peer = None
    if peer is not None and any(peer in net for net in networks):
        return True
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if token_hash and scheme.lower() == "bearer" and given:
        digest = hashlib.sha256(given.strip().encode()).hexdigest()
        if hmac.compare_digest(digest, token_hash):
            return True
    return False if token_hash else None


def metrics_view(request):
    allowed = _allowed(request)
    if allowed is False:
        response = HttpResponse("401 a bearer token is required\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="gpumarket metrics"'
        return response
    if allowed is None:
        return HttpResponse("403 this address may not read the metrics\n", status=403,
                            content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)


def registry() -> CollectorRegistry:
    """Every process's metrics (multi-process mode: core/metrics.py always sets the
    directory) and the market's state."""
    path = metrics.multiproc_dir()
    forget_dead_processes(path)
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(path))
    reg.register(MarketCollector())
    return reg


def forget_dead_processes(path) -> list[int]:
    """Drop the live gauges (feed clients) of processes that are gone; their counters
    stay (they are totals). Returns the dead pids. Same host only: pids are local."""
    dead = set()
    for name in os.listdir(path):
        match = _PID.search(name)
        if match and name.startswith("gauge_live"):
            pid = int(match.group(1))
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                dead.add(pid)
            except PermissionError:
                pass  # alive, another user's
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(path))
    return sorted(dead)


class MarketCollector:
    """The market's state at scrape: a handful of aggregate queries, no row per order or
    lease (bench/metrics_scrape.py). Prices in micro-USD per GPU-hour."""

    def collect(self):
        from marketplace.models import Lease, Order
        from providers.models import Gpu, Node

        depth = GaugeMetricFamily("gpumarket_book_depth_gpus",
                                  "Units resting in the order book", labels=["market", "side"])
        best = GaugeMetricFamily("gpumarket_book_best_price_usd_micros",
                                 "Best resting price (bid: highest, ask: lowest), micro-USD "
                                 "per GPU-hour", labels=["market", "side"])
        spread = GaugeMetricFamily("gpumarket_book_spread_usd_micros",
                                   "Best ask minus best bid, micro-USD per GPU-hour",
                                   labels=["market"])
        rows = (Order.objects.filter(status__in=Order.ACTIVE, remaining_gpus__gt=0)
                .values_list("market__slug", "side")
                .annotate(gpus=Sum("remaining_gpus"), high=Max("price"), low=Min("price"))
                .order_by())
        tops: dict[str, dict[str, int]] = {}
        for market, side, gpus, high, low in rows:
            depth.add_metric([market, side], gpus)
            price = high if side == Order.Side.BID else low
            best.add_metric([market, side], price)
            tops.setdefault(market, {})[side] = price
        for market, top in sorted(tops.items()):
            if Order.Side.BID in top and Order.Side.ASK in top:
                spread.add_metric([market], top[Order.Side.ASK] - top[Order.Side.BID])
        yield from (depth, best, spread)

        leases = GaugeMetricFamily("gpumarket_leases", "Leases not ended, by state",
                                   labels=["state"])
        counts = dict(Lease.objects.filter(status__in=Lease.ACTIVE).values_list("status")
                      .annotate(n=Count("pk")).order_by())
        for state in Lease.ACTIVE:
            leases.add_metric([state], counts.get(state, 0))
        yield leases

        gpus = GaugeMetricFamily("gpumarket_gpus", "Listed units (GPUs, MIG slices) by health",
                                 labels=["market", "health"])
        for market, healthy, n in (Gpu.objects.values_list("gpu_class__slug", "healthy")
                                   .annotate(n=Count("pk")).order_by("gpu_class__slug")):
            gpus.add_metric([market, "healthy" if healthy else "unhealthy"], n)
        yield gpus

        heard = GaugeMetricFamily("gpumarket_node_last_heartbeat_timestamp_seconds",
                                  "A node's last heartbeat (Unix time)", labels=["node"])
        for pk, at in (Node.objects.filter(last_heartbeat_at__isnull=False)
                       .values_list("pk", "last_heartbeat_at").order_by("pk")):
            heard.add_metric([str(pk)], at.timestamp())
        yield heard
        yield GaugeMetricFamily("gpumarket_scrape_timestamp_seconds",
                                "When this scrape read the database", value=time.time())
