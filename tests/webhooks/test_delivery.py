"""Delivery in this process (webhooks/delivery.py) against a real receiver on 127.0.0.1:
signed bodies that verify, the same id and bytes at every retry, back-off, the retry
window, bounded timeouts, and a private target refused at delivery time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from core import metrics
from tests.factories import UserFactory
from webhooks import delivery, services, signing
from webhooks.events import emit
from webhooks.models import WebhookDelivery, WebhookEvent

pytestmark = pytest.mark.django_db


def _endpoint(receiver, events=("lease.started",), user=None):
    user = user or UserFactory()
    endpoint, secret = services.create_endpoint(user_id=user.pk, url=receiver.url,
                                                events=list(events))
    receiver.secret = secret
    return user, endpoint


def test_an_event_arrives_signed_and_the_signature_verifies(receiver_factory, allow_private):
    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)
    event = emit(user.pk, "lease.started", {"lease": 7, "status": "running"})
    assert delivery.deliver_due(endpoint.pk) == (1, False)
    assert receiver.bad_signatures == 0
    [got] = receiver.events
    assert got == {"id": event.id, "type": "lease.started",
                   "created": int(event.created_at.timestamp()),
                   "data": {"lease": 7, "status": "running"}}
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_status_code, row.next_attempt_at) == (
        "delivered", 1, 200, None)
    assert row.latency_ms is not None and row.delivered_at is not None


def test_a_wrong_secret_or_a_changed_body_does_not_verify():
    body = b'{"id":"evt_1"}'
    value = signing.header("whsec_right", body)
    assert signing.verify("whsec_right", body, value)
    assert not signing.verify("whsec_wrong", body, value)
    assert not signing.verify("whsec_right", body + b" ", value)
    old = signing.header("whsec_right", body, t=1_000_000)
    assert not signing.verify("whsec_right", body, old)  # outside the tolerance
    assert not signing.verify("whsec_right", body, "v1=abc")


def test_no_endpoint_taking_the_type_writes_nothing(receiver_factory, allow_private):
    user, _ = _endpoint(receiver_factory(), events=["lease.failed"])
    assert emit(user.pk, "lease.started", {"lease": 1}) is None
    assert emit(UserFactory().pk, "lease.failed", {"lease": 1}) is None
    assert not WebhookEvent.objects.exists() and not WebhookDelivery.objects.exists()


def test_an_event_of_a_rolled_back_transaction_is_never_delivered(receiver_factory,
                                                                   allow_private):
    user, _ = _endpoint(receiver_factory())

    def failing_service():
        with transaction.atomic():
            emit(user.pk, "lease.started", {"lease": 1})
            raise RuntimeError("the service failed after emitting")

    with pytest.raises(RuntimeError):
        failing_service()
    assert not WebhookEvent.objects.exists() and not WebhookDelivery.objects.exists()


def test_a_500_is_retried_with_back_off_and_the_same_id_and_body(receiver_factory,
                                                                  allow_private, settings):
    settings.GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS = 10
    counted = {o: metrics.WEBHOOK_DELIVERIES.labels(o)._value.get()
               for o in ("delivered", "failed")}
    receiver = receiver_factory()
    receiver.answer = 500
    user, endpoint = _endpoint(receiver)
    event = emit(user.pk, "lease.started", {"lease": 3})
    before = timezone.now()
    assert delivery.deliver_due(endpoint.pk) == (1, False)
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == (
        "pending", 1, 500, "answered HTTP 500")
    assert before + timedelta(seconds=10) <= row.next_attempt_at
    assert delivery.deliver_due(endpoint.pk) == (0, False)  # not due yet: nothing sent
    for attempts, wait in ((2, 20), (3, 40)):  # doubling
        WebhookDelivery.objects.update(next_attempt_at=timezone.now())
        before = timezone.now()
        delivery.deliver_due(endpoint.pk)
        row.refresh_from_db()
        assert row.attempts == attempts
        assert before + timedelta(seconds=wait) <= row.next_attempt_at <= \
            timezone.now() + timedelta(seconds=wait)
    receiver.answer = 200
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    delivery.deliver_due(endpoint.pk)
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("delivered", 4)
    assert receiver.ids() == [event.id] * 4  # every attempt the same event, verified
    assert len({str(e) for e in receiver.events}) == 1
    # /metrics counts each attempt: 3 failed, 1 delivered (core/metrics.py)
    assert {o: metrics.WEBHOOK_DELIVERIES.labels(o)._value.get() - n
            for o, n in counted.items()} == {"delivered": 1, "failed": 3}


def test_retries_stop_after_the_window(receiver_factory, allow_private, settings):
    settings.GPUMARKET_WEBHOOK_RETRY_BASE_SECONDS = 120  # the next try would be past 24 h
    receiver = receiver_factory()
    receiver.answer = 503
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 3})
    WebhookEvent.objects.update(created_at=timezone.now() - timedelta(hours=23, minutes=59))
    delivery.deliver_due(endpoint.pk)
    row = WebhookDelivery.objects.get()
    assert (row.status, row.next_attempt_at, row.attempts) == ("failed", None, 1)
    assert delivery.due_endpoint_ids() == []


def test_a_receiver_that_hangs_times_out_within_the_read_timeout(receiver_factory,
                                                                allow_private, settings):
    settings.GPUMARKET_WEBHOOK_READ_TIMEOUT_SECONDS = 0.5
    receiver = receiver_factory()
    receiver.hang = threading.Event()
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 3})
    delivery.deliver_due(endpoint.pk)
    receiver.hang.set()
    row = WebhookDelivery.objects.get()
    assert (row.status, row.last_error, row.last_status_code) == ("pending", "timed out", None)


def test_a_receiver_that_is_down_is_a_connection_failure(receiver_factory, allow_private):
    receiver = receiver_factory(start=False)  # nothing listens on its port
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 3})
    delivery.deliver_due(endpoint.pk)
    row = WebhookDelivery.objects.get()
    assert row.status == "pending" and row.last_error.startswith("connection failed")


def test_a_private_target_is_refused_at_delivery_too(receiver_factory, settings):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True
    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)  # registered while private targets were allowed
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = False
    emit(user.pk, "lease.started", {"lease": 3})
    delivery.deliver_due(endpoint.pk)
    assert receiver.events == [] and not receiver.arrived.is_set()
    row = WebhookDelivery.objects.get()
    assert row.status == "pending" and row.attempts == 1
    assert "private or loopback address (127.0.0.1)" in row.last_error


def test_one_endpoint_is_delivered_by_one_worker_at_a_time(receiver_factory, allow_private):
    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 3})
    assert delivery._acquire(endpoint.pk)  # another worker holds it
    assert delivery.deliver_due(endpoint.pk) == (0, False)
    assert delivery.due_endpoint_ids() == []
    assert receiver.events == []


def test_old_events_are_pruned_unless_a_delivery_is_still_pending(receiver_factory,
                                                                   allow_private):
    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)
    done = emit(user.pk, "lease.started", {"lease": 1})
    delivery.deliver_due(endpoint.pk)
    waiting = emit(user.pk, "lease.started", {"lease": 2})
    fresh = emit(user.pk, "lease.started", {"lease": 3})
    WebhookEvent.objects.filter(pk__in=[done.pk, waiting.pk]).update(
        created_at=timezone.now() - timedelta(days=31))
    assert delivery.prune() == 1
    assert set(WebhookEvent.objects.values_list("pk", flat=True)) == {waiting.pk, fresh.pk}
    assert not WebhookDelivery.objects.filter(event_id=done.pk).exists()


def test_a_secret_no_key_opens_sends_nothing_unsigned(receiver_factory, allow_private,
                                                       settings):
    from cryptography.fernet import Fernet

    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 1})
    settings.GPUMARKET_SECRETS_KEYS = [Fernet.generate_key().decode()]  # the old key gone
    delivery.deliver_due(endpoint.pk)
    assert not receiver.arrived.is_set()
    row = WebhookDelivery.objects.get()
    assert row.status == "pending" and "cannot be opened" in row.last_error


def test_a_disabled_endpoint_gets_nothing(receiver_factory, allow_private):
    receiver = receiver_factory()
    user, endpoint = _endpoint(receiver)
    emit(user.pk, "lease.started", {"lease": 3})
    services.update_endpoint(user_id=user.pk, endpoint_id=endpoint.pk, enabled=False)
    assert delivery.deliver_due(endpoint.pk) == (0, False)
    assert emit(user.pk, "lease.started", {"lease": 4}) is None
    assert receiver.events == []
