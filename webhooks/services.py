"""A user's webhook endpoints: create (the signing secret returned once), change,
delete, send a test event. Refusals are marketplace.errors (the API's 4xx), naming the
field; nothing is written on a refusal."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from marketplace.errors import Conflict, InvalidInput, NotFound
from marketplace.sealing import seal_text
from webhooks import signing, targets
from webhooks.events import EVENT_TYPES, emit
from webhooks.models import WebhookEndpoint, WebhookEvent

SUBSCRIBABLE = sorted(t for t in EVENT_TYPES if t != "webhook.test")


def clean_url(url: str) -> str:
    try:
        targets.check(url)
    except targets.TargetRefused as exc:
        raise InvalidInput(str(exc), field="url") from None
    return url


def clean_events(events: list[str]) -> list[str]:
    if not events:
        raise InvalidInput("events must name at least one event type", field="events")
    if "webhook.test" in events:
        raise InvalidInput("'webhook.test' is sent only by an endpoint's test button; it "
                           "cannot be subscribed to", field="events")
    unknown = [e for e in events if e not in SUBSCRIBABLE]
    if unknown:
        raise InvalidInput(f"unknown event type {unknown[0]!r} (one of "
                           f"{', '.join(SUBSCRIBABLE)})", field="events")
    return sorted(set(events))


def create_endpoint(*, user_id: int, url: str, events: list[str]) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret (shown this once; stored sealed)."""
    events = clean_events(events)
    url = clean_url(url)
    secret = signing.new_secret()
    with transaction.atomic():
        count = WebhookEndpoint.objects.select_for_update().filter(user_id=user_id).count()
        if count >= settings.GPUMARKET_WEBHOOK_MAX_ENDPOINTS:
            raise InvalidInput(f"at most {settings.GPUMARKET_WEBHOOK_MAX_ENDPOINTS} "
                               "webhook endpoints per user", field="url")
        endpoint = WebhookEndpoint.objects.create(user_id=user_id, url=url, events=events,
                                                  secret_sealed=seal_text(secret))
    return endpoint, secret


def endpoint_of(*, user_id: int, endpoint_id: int) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(user_id=user_id, pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return endpoint


def update_endpoint(*, user_id: int, endpoint_id: int, url: str | None = None,
                    events: list[str] | None = None,
                    enabled: bool | None = None) -> WebhookEndpoint:
    """Change what is given; the URL is checked again."""
    endpoint = endpoint_of(user_id=user_id, endpoint_id=endpoint_id)
    fields = []
    if events is not None:
        endpoint.events = clean_events(events)
        fields.append("events")
    if url is not None:
        endpoint.url = clean_url(url)
        fields.append("url")
    if enabled is not None:
        endpoint.enabled = enabled
        fields.append("enabled")
    if fields:
        endpoint.save(update_fields=fields)
    return endpoint


def delete_endpoint(*, user_id: int, endpoint_id: int) -> None:
    endpoint_of(user_id=user_id, endpoint_id=endpoint_id).delete()


def send_test(*, user_id: int, endpoint_id: int) -> WebhookEvent:
    """A `webhook.test` event to this endpoint only (delivered by the worker)."""
    endpoint = endpoint_of(user_id=user_id, endpoint_id=endpoint_id)
    if not endpoint.enabled:
        raise Conflict("the endpoint is disabled: enable it first", field="enabled")
    return emit(user_id, "webhook.test", {"endpoint": endpoint.pk,
                                          "message": "a test event from gpumarket"},
                endpoint_id=endpoint.pk)
