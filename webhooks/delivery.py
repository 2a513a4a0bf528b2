"""Delivering an endpoint's pending events, from the worker: claim one due delivery at a
time (a short transaction pushes its next_attempt_at past the longest attempt, so no
other worker takes it meanwhile), POST it signed, record the outcome. A 2xx delivers;
anything else (status, refused target, timeout) retries with exponential back-off
(GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS doubling up to …_MAX_SECONDS) until
GPUMARKET_WEBHOOK_RETRY_WINDOW_SECONDS after the event, then `failed`. At-least-once:
a worker that dies mid-attempt leaves the claim to expire and the attempt is made again.
Timeouts: connect GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS (3), read …_READ_ (5)."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

import urllib3
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import metrics
from marketplace.sealing import Unsealable, unseal_text
from webhooks import signing, targets
from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

log = logging.getLogger("gpumarket.webhooks")

MAX_RESPONSE_BYTES = 64 * 1024  # read at most this much of an answer, then hang up
USER_AGENT = "gpumarket-webhooks/1"


def event_body(event: WebhookEvent) -> bytes:
    """The JSON body of `event`, the same bytes at every attempt:
    {"id", "type", "created" (unix seconds), "data"}."""
    return json.dumps({"id": event.id, "type": event.type,
                       "created": int(event.created_at.timestamp()), "data": event.payload},
                      sort_keys=True, separators=(",", ":")).encode()


def claim_seconds() -> float:
    return (settings.GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS
            + settings.GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS) * 2 + 30


def backoff_seconds(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt: base × 2^(attempts − 1), capped."""
    base = settings.GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS
    return min(base * 2 ** max(attempts - 1, 0), settings.GPUMARKET_WEBHOOK_RETRY_MAX_SECONDS)


def claim(endpoint_id: int, now: datetime | None = None) -> WebhookDelivery | None:
    """The endpoint's oldest due pending delivery, claimed; None when none is due."""
    now = now or timezone.now()
    with transaction.atomic():
        delivery = (WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
                    .select_related("event", "endpoint")
                    .filter(endpoint_id=endpoint_id, endpoint__enabled=True,
                            status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now)
                    .order_by("next_attempt_at", "pk").first())
        if delivery is None:
            return None
        delivery.next_attempt_at = now + timedelta(seconds=claim_seconds())
        delivery.save(update_fields=["next_attempt_at"])
        WebhookEndpoint.objects.filter(pk=endpoint_id).update(busy_until=delivery.next_attempt_at)
    return delivery


def attempt(delivery: WebhookDelivery) -> bool:
    """POST the claimed `delivery` once and record the outcome; True on a 2xx."""
    body = event_body(delivery.event)
    try:
        secret = unseal_text(delivery.endpoint.secret_sealed)
    except Unsealable:  # a key removed too early: nothing is sent unsigned
        record(delivery, status=None, latency_ms=0,
               error="the signing secret cannot be opened (GPUMARKET_SECRETS_KEY)")
        return False
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               "Gpumarket-Event-Id": delivery.event.id,
               signing.HEADER: signing.header(secret, body)}
    started = time.monotonic()
    status, error = None, ""
    try:
        status = post(delivery.endpoint.url, body, headers)
        if not 200 <= status < 300:
            error = f"answered HTTP {status}"
    except targets.TargetRefused as exc:
        error = f"url refused: {exc}"
    except urllib3.exceptions.NewConnectionError:  # before TimeoutError: its subclass
        error = "connection failed (refused or unreachable)"
    except urllib3.exceptions.TimeoutError:
        error = "timed out"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        error = f"connection failed ({type(exc).__name__})"
    latency_ms = round((time.monotonic() - started) * 1000)
    record(delivery, status=status, error=error, latency_ms=latency_ms)
    return not error


def record(delivery: WebhookDelivery, *, status: int | None, error: str, latency_ms: int,
           now: datetime | None = None) -> None:
    """Write one attempt's outcome (and the next attempt's time, or the final status)."""
    now = now or timezone.now()
    attempts = delivery.attempts + 1
    fields = {"attempts": attempts, "last_status_code": status, "latency_ms": latency_ms,
              "last_error": error[:200], "last_attempt_at": now}
    if not error:
        fields.update(status=WebhookDelivery.Status.DELIVERED, delivered_at=now,
                      next_attempt_at=None)
    else:
        retry_at = now + timedelta(seconds=backoff_seconds(attempts))
        deadline = delivery.event.created_at + timedelta(
            seconds=settings.GPUMARKET_WEBHOOK_RETRY_WINDOW_SECONDS)
        if retry_at > deadline:
            fields.update(status=WebhookDelivery.Status.FAILED, next_attempt_at=None)
        else:
            fields.update(next_attempt_at=retry_at)
        log.info("webhook %s to endpoint %s: attempt %s %s", delivery.event_id,
                 delivery.endpoint_id, attempts, error)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(**fields)
    metrics.webhook_attempt(not error)
    for name, value in fields.items():
        setattr(delivery, name, value)


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST `body` to `url` at an address checked by targets.resolve; the answer's
    status. Raises TargetRefused, urllib3's errors or OSError. No redirects followed."""
    parts = targets.parse(url)
    address = targets.resolve(parts)[0]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    timeout = urllib3.Timeout(connect=settings.GPUMARKET_WEBHOOK_CONNECT_TIMEOUT_SECONDS,
                              read=settings.GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS)
    if parts.scheme == "https":  # TLS checked against the URL's name, not the address
        pool = urllib3.HTTPSConnectionPool(address, port, timeout=timeout, retries=False,
                                           server_hostname=parts.hostname,
                                           assert_hostname=parts.hostname,
                                           cert_reqs="CERT_REQUIRED")
    else:
        pool = urllib3.HTTPConnectionPool(address, port, timeout=timeout, retries=False)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        answer = pool.urlopen("POST", path, body=body, headers={**headers, "Host": parts.netloc},
                              redirect=False, retries=False, preload_content=False)
        answer.read(MAX_RESPONSE_BYTES)
        answer.release_conn()
        return answer.status
    finally:
        pool.close()


def deliver_due(endpoint_id: int, *, limit: int = 50) -> tuple[int, bool]:
    """Attempt up to `limit` of the endpoint's due deliveries, oldest first, stopping at
    the first failure (the endpoint is struggling: the rest wait for their own turn).
    Only one worker delivers to an endpoint at a time (`busy_until`; another returns at
    once), so a hanging receiver holds one worker at most. Returns (attempts made,
    whether more may be due)."""
    if not _acquire(endpoint_id):
        return 0, False
    made = 0
    try:
        while made < limit:
            delivery = claim(endpoint_id)
            if delivery is None:
                return made, False
            made += 1
            if not attempt(delivery):
                return made, False
        return made, True
    finally:
        WebhookEndpoint.objects.filter(pk=endpoint_id).update(busy_until=None)


def _acquire(endpoint_id: int) -> bool:
    now = timezone.now()
    return bool(WebhookEndpoint.objects
                .filter(Q(busy_until__isnull=True) | Q(busy_until__lt=now), pk=endpoint_id)
                .update(busy_until=now + timedelta(seconds=claim_seconds())))


def prune(now: datetime | None = None) -> int:
    """Delete events older than GPUMARKET_WEBHOOK_KEEP_DAYS with no pending delivery (and
    their deliveries): the log stays bounded. Returns how many events went."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.GPUMARKET_WEBHOOK_KEEP_DAYS)
    old = (WebhookEvent.objects.filter(created_at__lt=cutoff)
           .exclude(deliveries__status=WebhookDelivery.Status.PENDING))
    _, by_model = old.delete()
    return by_model.get("webhooks.WebhookEvent", 0)


def due_endpoint_ids(now: datetime | None = None, limit: int = 1000) -> list[int]:
    """Endpoints with a pending delivery due by `now` (the beat sweep's work)."""
    now = now or timezone.now()
    return list(WebhookDelivery.objects
                .filter(Q(endpoint__busy_until__isnull=True) | Q(endpoint__busy_until__lt=now),
                        status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now,
                        endpoint__enabled=True)
                .order_by().values_list("endpoint_id", flat=True).distinct()[:limit])
