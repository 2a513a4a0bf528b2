"""The marketplace's Prometheus metrics: every definition, and the one-line helpers the
market, ledger, runner API, feed and worker call (docs/METRICS.md lists names and labels).

prometheus_client in multi-process mode when PROMETHEUS_MULTIPROC_DIR is set (settings
default it to var/prometheus/): each process writes its own files there and /metrics
(marketplace/metrics_view.py) adds them up. Counters move after commit (a rolled-back
transaction counts nothing). Money in micro-USD (`usd_micros`, DESIGN.md's base unit:
integers, exact in a float64 up to 2^53), durations in seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.db import transaction


def _multiproc_dir() -> str:
    """PROMETHEUS_MULTIPROC_DIR, by default GPUMARKET_VAR_DIR's (var/) prometheus/ (set
    here, not in settings: marketplace/__init__ imports this module before them)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or str(
        Path(os.environ.get("GPUMARKET_VAR_DIR") or Path(__file__).resolve().parents[1] / "var")
        / "prometheus")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    Path(path).mkdir(parents=True, exist_ok=True)
    return path


_multiproc_dir()
from prometheus_client import Counter, Gauge, Histogram, values  # noqa: E402

if values.ValueClass.__name__ == "MutexValue":
    # prometheus_client was imported before the directory was set: switch now (every
    # metric below is made after this line, so all of them write to the directory)
    values.ValueClass = values.MultiProcessValue()

# latency buckets (seconds): a lock wait or a match is ms; a handoff is seconds
FAST = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
SLOW = (.25, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

ORDERS_PLACED = Counter("gpumarket_orders_placed_total", "Orders placed (asks, bids)",
                        ["side"])
ORDERS_REFUSED = Counter("gpumarket_orders_refused_total",
                         "Orders refused, by the refusal's kind (invalid_input, conflict, "
                         "insufficient_funds, market_busy, …)", ["side", "reason"])
FILLS = Counter("gpumarket_fills_total", "Fills (kind: continuous, sealed)",
                ["market", "kind"])
GPU_SECONDS = Counter("gpumarket_traded_gpu_seconds_total",
                      "GPU-seconds traded (units × leased seconds; / 3600 = GPU-hours)",
                      ["market", "kind"])
MATCHING = Histogram("gpumarket_matching_duration_seconds",
                     "One order matched by the engine and its result written", ["side"],
                     buckets=FAST)
BID_GROUP = Histogram("gpumarket_bid_group_duration_seconds",
                      "One group of bids placed in one transaction under the market lock",
                      buckets=FAST)
BID_GROUP_SIZE = Histogram("gpumarket_bid_group_size", "Bids per group transaction",
                           buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
HEARTBEAT_GROUP_SIZE = Histogram("gpumarket_heartbeat_group_size",
                                 "Heartbeats per group the heartbeat batcher wrote",
                                 buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
LOCK_WAIT = Histogram("gpumarket_market_lock_wait_seconds",
                      "Wait for a market's single-writer lock", buckets=FAST)
BOOK_LOADS = Counter("gpumarket_book_loads_total",
                     "Order books a market's writer got from the process cache (hit, "
                     "caught_up), rebuilt from the database (rebuilt), or loaded before "
                     "serving (warmed)", ["how"])
LEASE_STARTS = Counter("gpumarket_lease_starts_total", "Leases the runner reported running",
                       ["market"])
HANDOFF = Histogram("gpumarket_lease_handoff_seconds",
                    "From the lease's creation (fill, auction close) to running",
                    buckets=SLOW)
LEASES_ENDED = Counter("gpumarket_leases_ended_total", "Leases ended, by final state",
                       ["state"])
FAILURES = Counter("gpumarket_lease_failures_total",
                   "Leases failed, by cause (node_silent, xid, ecc, thermal, gpu_lost, "
                   "workload_exit, image, other)", ["cause"])
WEBHOOK_DELIVERIES = Counter("gpumarket_webhook_deliveries_total",
                             "Webhook delivery attempts (outcome: delivered, failed)",
                             ["outcome"])
HEARTBEATS = Counter("gpumarket_heartbeats_total", "Runner heartbeats received")
HEARTBEATS_LATE = Counter("gpumarket_heartbeats_late_total",
                          "Heartbeats that came more than GPUMARKET_METRICS_HEARTBEAT_LATE_"
                          "SECONDS after the node's previous one")
LEDGER_HELD = Counter("gpumarket_ledger_held_usd_micros_total",
                      "Micro-USD placed in holds (escrow)")
LEDGER_CAPTURED = Counter("gpumarket_ledger_captured_usd_micros_total",
                          "Micro-USD captured from holds (lease cost, fee included)")
LEDGER_FEES = Counter("gpumarket_ledger_fees_usd_micros_total",
                      "Micro-USD of platform fees captured")
LEDGER_CHECK_OK = Gauge("gpumarket_ledger_check_ok",
                        "1 if the last ledger_check found no violation, 0 if it found one",
                        multiprocess_mode="mostrecent")
LEDGER_CHECK_TIME = Gauge("gpumarket_ledger_check_last_run_timestamp_seconds",
                          "When ledger_check last ran (Unix time)",
                          multiprocess_mode="mostrecent")
STRIPE_WEBHOOKS = Counter("gpumarket_stripe_webhooks_total",
                          "Stripe webhook deliveries, by outcome", ["outcome"])
FEED_CLIENTS = Gauge("gpumarket_feed_clients", "Websocket clients connected now",
                     ["channel"], multiprocess_mode="livesum")
FEED_MESSAGES = Counter("gpumarket_feed_messages_total", "Feed events published",
                        ["channel"])

# Celery, with celery-exporter's names (github.com/danihodovic/celery-exporter)
CELERY_STARTED = Counter("celery_task_started_total", "Tasks started", ["name", "hostname"])
CELERY_SUCCEEDED = Counter("celery_task_succeeded_total", "Tasks succeeded",
                           ["name", "hostname"])
CELERY_FAILED = Counter("celery_task_failed_total", "Tasks failed",
                        ["name", "hostname", "exception"])
CELERY_RETRIED = Counter("celery_task_retried_total", "Tasks retried", ["name", "hostname"])
CELERY_RUNTIME = Histogram("celery_task_runtime", "Task runtime in seconds",
                           ["name", "hostname"], buckets=(*FAST, 30, 60, 300))


def after_commit(fn) -> None:
    """Run `fn` when the current transaction commits (at once outside one)."""
    transaction.on_commit(fn)


def _reason(exc: BaseException) -> str:
    """A refusal's kind, snake_case from its class (InsufficientFunds → insufficient_funds)."""
    name = type(exc).__name__
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def order_outcomes(side: str, results) -> None:
    """Count placed and refused orders: `results` are book.Placed or the refusing
    exception; None (a slot answered later) and a replay (created False) count nothing."""
    for r in results:
        if isinstance(r, BaseException):
            ORDERS_REFUSED.labels(side, _reason(r)).inc()
        elif r is not None and r.created:
            ORDERS_PLACED.labels(side).inc()


def counted_ask(place):
    """Decorate book.place_ask: count its outcome (placed, or the refusal's reason)."""
    def wrapper(*args, **kwargs):
        try:
            placed = place(*args, **kwargs)
        except Exception as exc:
            order_outcomes("ask", [exc])
            raise
        order_outcomes("ask", [placed])
        return placed
    wrapper.__wrapped__, wrapper.__doc__, wrapper.__name__ = place, place.__doc__, place.__name__
    return wrapper


def fill(market: str, kind: str, gpus: int, seconds: int) -> None:
    """A fill of `gpus` units for `seconds` (after commit)."""
    def inc():
        FILLS.labels(market, kind).inc()
        GPU_SECONDS.labels(market, kind).inc(gpus * seconds)
    after_commit(inc)


def lease_running(market: str, created_at, started_at) -> None:
    """A lease started: count it and its handoff time (created → running)."""
    seconds = max((started_at - created_at).total_seconds(), 0.0) if created_at else None

    def inc():
        LEASE_STARTS.labels(market).inc()
        if seconds is not None:
            HANDOFF.observe(seconds)
    after_commit(inc)


_CAUSES = (("missed heartbeats", "node_silent"), ("xid", "xid"), ("ecc", "ecc"),
           ("retired", "ecc"), ("remap", "ecc"), ("temperature", "thermal"),
           ("thermal", "thermal"), ("lost", "gpu_lost"), ("image", "image"),
           ("pull", "image"), ("exit", "workload_exit"), ("died", "workload_exit"))


def failure_cause(cause: str) -> str:
    """A bounded label for a failure's free-text cause (first keyword that matches)."""
    text = (cause or "").lower()
    return next((label for word, label in _CAUSES if word in text), "other")


def lease_ended(state: str, cause: str) -> None:
    def inc():
        LEASES_ENDED.labels(state).inc()
        if state == "failed":
            FAILURES.labels(failure_cause(cause)).inc()
    after_commit(inc)


def heartbeat(previous, now, late_seconds: float) -> None:
    """A heartbeat at `now`; late when the node's `previous` one is older than
    `late_seconds` (a first heartbeat is never late)."""
    HEARTBEATS.inc()
    if previous is not None and (now - previous).total_seconds() > late_seconds:
        HEARTBEATS_LATE.inc()


def ledger_held(amount: int) -> None:
    after_commit(lambda: LEDGER_HELD.inc(amount))


def ledger_captured(amount: int, fee: int) -> None:
    def inc():
        LEDGER_CAPTURED.inc(amount)
        LEDGER_FEES.inc(fee)
    after_commit(inc)


def ledger_check_result(ok: bool) -> None:
    LEDGER_CHECK_OK.set(1 if ok else 0)
    LEDGER_CHECK_TIME.set(time.time())


# -- Celery signals (connect_celery) ----------------------------------------------------
_started: dict[str, float] = {}


def _host(task) -> str:
    return getattr(getattr(task, "request", None), "hostname", None) or ""


def _prerun(task_id=None, task=None, **_kw) -> None:
    _started[task_id] = time.perf_counter()
    CELERY_STARTED.labels(task.name, _host(task)).inc()


def _postrun(task_id=None, task=None, state=None, **_kw) -> None:
    began = _started.pop(task_id, None)
    if began is not None:
        CELERY_RUNTIME.labels(task.name, _host(task)).observe(time.perf_counter() - began)
    if state == "SUCCESS":
        CELERY_SUCCEEDED.labels(task.name, _host(task)).inc()


def _failure(sender=None, exception=None, **_kw) -> None:
    CELERY_FAILED.labels(sender.name, _host(sender), type(exception).__name__).inc()


def _retry(sender=None, **_kw) -> None:
    CELERY_RETRIED.labels(sender.name, _host(sender)).inc()


def connect_celery() -> None:
    """Count every task's start, outcome and runtime (task_prerun/postrun/failure/retry)."""
    from celery import signals

    signals.task_prerun.connect(_prerun, weak=False)
    signals.task_postrun.connect(_postrun, weak=False)
    signals.task_failure.connect(_failure, weak=False)
    signals.task_retry.connect(_retry, weak=False)


def multiproc_dir() -> Path:
    return Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or _multiproc_dir())


def timed_group(write):
    """Decorate book._write_bids(market_id, items, now): its duration and group size."""
    def wrapper(market_id, items, now, *args, **kwargs):
        BID_GROUP_SIZE.observe(len(items))
        with BID_GROUP.time():
            return write(market_id, items, now, *args, **kwargs)
    wrapper.__wrapped__, wrapper.__doc__, wrapper.__name__ = write, write.__doc__, write.__name__
    return wrapper


def timed_match(apply):
    """Decorate matching.apply_result(market, incoming, result, now): its duration, by the
    incoming order's side."""
    def wrapper(market, incoming, result, now):
        with MATCHING.labels(incoming.side).time():
            return apply(market, incoming, result, now)
    wrapper.__wrapped__, wrapper.__doc__, wrapper.__name__ = apply, apply.__doc__, apply.__name__
    return wrapper


def _webhook_outcome(text: str) -> str:
    word = (text or "").split(" ", 1)[0].lower().rstrip(":")
    return word if word in ("credited", "duplicate", "ignored", "refunded") else "applied"


def counted_webhook(handle):
    """Decorate stripe_payments.webhook_handle: count each delivery's outcome (credited,
    duplicate, ignored, refunded, applied; refused, disabled, error when it raises)."""
    def wrapper(*args, **kwargs):
        try:
            outcome = handle(*args, **kwargs)
        except Exception as exc:
            name = type(exc).__name__
            STRIPE_WEBHOOKS.labels({"WebhookRefused": "refused",
                                    "StripeDisabled": "disabled"}.get(name, "error")).inc()
            raise
        STRIPE_WEBHOOKS.labels(_webhook_outcome(outcome)).inc()
        return outcome
    wrapper.__wrapped__, wrapper.__doc__, wrapper.__name__ = handle, handle.__doc__, handle.__name__
    return wrapper


def _channel(group: str) -> str:
    """A feed group's kind: market, auction or user (the part before the dot)."""
    return group.partition(".")[0] or "other"


def feed_client(group: str, delta: int) -> None:
    """A websocket client joined (+1) or left (-1) `group`."""
    FEED_CLIENTS.labels(_channel(group)).inc(delta)


def feed_messages(events) -> None:
    """Feed events published (each a dict with its `group`)."""
    for event in events:
        FEED_MESSAGES.labels(_channel(event["group"])).inc()


def webhook_attempt(delivered: bool) -> None:
    """One webhook delivery attempt's outcome (webhooks/delivery.py records it)."""
    WEBHOOK_DELIVERIES.labels("delivered" if delivered else "failed").inc()
