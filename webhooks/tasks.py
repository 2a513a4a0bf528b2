"""Celery tasks of webhooks: one task per endpoint (a slow or hanging receiver holds
only its own task, bounded by the timeouts), and a beat sweep that queues the endpoints
with due deliveries (retries, and anything whose after-commit queueing was lost)."""

from __future__ import annotations

from celery import shared_task

from webhooks import delivery


@shared_task(name="webhooks.tasks.deliver_endpoint", acks_late=True)
def deliver_endpoint(endpoint_id: int) -> int:
    """Deliver the endpoint's due events; queue itself again when more remain."""
    made, more = delivery.deliver_due(endpoint_id)
    if more:
        deliver_endpoint.delay(endpoint_id)
    return made


@shared_task(name="webhooks.tasks.prune_webhook_events")
def prune_webhook_events() -> int:
    """Beat (hourly): drop events past GPUMARKET_WEBHOOK_KEEP_DAYS, delivered or failed."""
    return delivery.prune()


@shared_task(name="webhooks.tasks.deliver_due_webhooks")
def deliver_due_webhooks() -> list[int]:
    """Beat sweep: a deliver_endpoint task for each endpoint with a due delivery."""
    ids = delivery.due_endpoint_ids()
    for endpoint_id in ids:
        deliver_endpoint.delay(endpoint_id)
    return ids
