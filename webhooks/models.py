"""A user's webhook endpoints, the events emitted for them and one delivery per
(endpoint, event). Shapes and the protocol: docs/WEBHOOKS.md."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class WebhookEndpoint(models.Model):
    """Where a user's events go: `events` is the list of event types it takes
    (webhooks.events.EVENT_TYPES); its signing secret is sealed (marketplace/sealing.py)
    and shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="webhook_endpoints")
    url = models.CharField(max_length=2000)
    events = models.JSONField(default=list)
    secret_sealed = models.TextField(editable=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # set while a worker delivers to it: one attempt in flight per endpoint at a time
    busy_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"webhook {self.pk} → {self.url}"


class WebhookEvent(models.Model):
    """One thing that happened to `user`: a stable id (`evt_` + 24 hex digits) that
    every retry carries, so a receiver drops duplicates by id."""

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="webhook_events")
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class WebhookDelivery(models.Model):
    """An event's delivery to one endpoint: `pending` until a 2xx (`delivered`) or until
    its retries run out GPUMARKET_WEBHOOK_RETRY_WINDOW_SECONDS after the event
    (`failed`). `next_attempt_at` is when the worker tries next (None when done);
    latency in whole milliseconds."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE,
                              related_name="deliveries")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "event"],
                                               name="one_delivery_per_endpoint_event")]
        indexes = [models.Index(fields=["status", "next_attempt_at"],
                                name="webhook_delivery_due")]

    def __str__(self) -> str:
        return f"{self.event_id} → endpoint {self.endpoint_id}: {self.status}"
