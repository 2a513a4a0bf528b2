"""The event types and `emit`, which the market's services call inside their own
transaction: it writes the event and one pending delivery per endpoint of the user that
takes the type; after commit it asks the worker to deliver (never from the request).
Imports nothing of the project but this app's models (settlement calls it too)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django.db import transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

log = logging.getLogger("gpumarket.webhooks")

# type → what it says (docs/WEBHOOKS.md lists the payloads)
EVENT_TYPES = {
    "order.filled": "a bid or ask of yours filled (partly or whole)",
    "order.outbid": "a better bid took the GPUs of an ask your resting bid could pay",
    "auction.won": "your sealed bid won an auction",
    "auction.lost": "your sealed bid lost an auction",
    "lease.preemption_notice": "a higher bid preempts your interruptible lease at preempt_at",
    "lease.started": "your lease's container is running",
    "lease.stopped": "your lease ended: completed, cancelled or preempted",
    "lease.failed": "your lease failed, with its cause",
    "health.finding": "a GPU of your lease or node turned unhealthy or recovered",
    "payout.paid": "a payout of yours was paid",
    "topup.credited": "a top-up reached your wallet",
    "alert.fired": "an alert rule of yours fired on a lease or node",
    "alert.resolved": "an alert rule of yours stopped firing",
    "webhook.test": "the test event of an endpoint's 'send test event'",
}
TASK = "webhooks.tasks.deliver_endpoint"


def new_event_id() -> str:
    return "evt_" + secrets.token_hex(12)


def emit(user_id: int, type: str, payload: dict[str, Any], *,
         endpoint_id: int | None = None) -> WebhookEvent | None:
    """Record event `type` for `user_id` and a delivery to each of their enabled endpoints
    that takes it (only `endpoint_id` when given, whatever its types). None, writing
    nothing, when no endpoint takes it. The payload is JSON: ids, statuses, integer
    micro-USD, ISO times."""
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {type!r}")
    endpoints = WebhookEndpoint.objects.filter(user_id=user_id, enabled=True)
    if endpoint_id is not None:
        targets = [e.pk for e in endpoints.filter(pk=endpoint_id).only("pk")]
    else:  # filtered here: JSON containment differs between PostgreSQL and SQLite
        targets = [e.pk for e in endpoints.only("pk", "events") if type in e.events]
    if not targets:
        return None
    now = timezone.now()
    with transaction.atomic():
        event = WebhookEvent.objects.create(id=new_event_id(), user_id=user_id, type=type,
                                            payload=payload, created_at=now)
        WebhookDelivery.objects.bulk_create(
            WebhookDelivery(endpoint_id=pk, event=event, next_attempt_at=now, created_at=now)
            for pk in targets)
        transaction.on_commit(lambda: _enqueue(targets))
    return event


def emit_many(items: list[tuple[int, str, dict[str, Any]]]) -> list[WebhookEvent]:
    """emit for each (user id, type, payload) of `items`, in a fixed number of statements:
    one read of the users' enabled endpoints, one INSERT of the events and one of their
    deliveries (only for users with an endpoint that takes the type). Returns the events
    written, in the order of `items`."""
    for _, type, _ in items:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {type!r}")
    if not items:
        return []
    takes: dict[int, list[tuple[int, list[str]]]] = {}
    for pk, user_id, types in (WebhookEndpoint.objects
                               .filter(user_id__in=_users({u for u, _, _ in items}),
                                       enabled=True)
                               .order_by("pk").values_list("pk", "user_id", "events")):
        takes.setdefault(user_id, []).append((pk, types))
    now = timezone.now()
    events, deliveries, targets_all = [], [], []
    for user_id, type, payload in items:
        targets = [pk for pk, types in takes.get(user_id, ()) if type in types]
        if not targets:
            continue
        event = WebhookEvent(id=new_event_id(), user_id=user_id, type=type, payload=payload,
                             created_at=now)
        events.append(event)
        deliveries += [WebhookDelivery(endpoint_id=pk, event=event, next_attempt_at=now,
                                       created_at=now) for pk in targets]
        targets_all += targets
    if not events:
        return []
    with transaction.atomic():
        WebhookEvent.objects.bulk_create(events)
        WebhookDelivery.objects.bulk_create(deliveries)
        unique = list(dict.fromkeys(targets_all))
        transaction.on_commit(lambda: _enqueue(unique))
    return events


def _users(ids: set[int]):
    """`ids` for a `user_id__in` filter: on PostgreSQL one array parameter
    (`IN (SELECT unnest(%s::bigint[]))`) — an IN list of 10,000 placeholders cost ~0.5 s
    of CPU to render and parse (bench/README.md "Sealed close"); elsewhere the list."""
    if transaction.get_connection().vendor != "postgresql":
        return sorted(ids)
    return RawSQL("SELECT unnest(%s::bigint[])", [sorted(ids)])


def _enqueue(endpoint_ids: list[int]) -> None:
    """Ask the worker to deliver to each endpoint (a task per endpoint). A broker that
    does not answer loses nothing: the beat sweep finds the pending deliveries."""
    from celery import current_app

    for pk in endpoint_ids:
        try:
            current_app.send_task(TASK, args=[pk])
        except Exception as exc:  # any broker error: the sweep delivers
            log.warning("webhook endpoint %s: delivery not queued (%s); the sweep will",
                        pk, type(exc).__name__)
