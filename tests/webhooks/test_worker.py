"""Delivery by a real Celery worker (with beat) after commit: a signed event reaches a
receiver on 127.0.0.1; an alert rule the worker evaluates fires a signed `alert.fired`;
a receiver down for a while gets every event once it is back, each once by id; a hanging
receiver does not delay another endpoint."""

from __future__ import annotations

import threading

import pytest

from alerts.models import AlertIncident
from tests.factories import UserFactory, registered_node
from tests.support.api import client_for, runner_client
from tests.support.waiting import wait_until
from webhooks import services
from webhooks.events import emit
from webhooks.models import WebhookDelivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("allow_private")]


def _endpoint(receiver, events=("lease.started", "lease.failed")):
    user = UserFactory()
    endpoint, secret = services.create_endpoint(user_id=user.pk, url=receiver.url,
                                                events=list(events))
    receiver.secret = secret
    return user, endpoint


def test_the_worker_delivers_a_signed_event_after_commit(webhook_worker, receiver_factory):
    receiver = receiver_factory()
    user, _ = _endpoint(receiver)
    event = emit(user.pk, "lease.failed", {"lease": 9, "status": "failed",
                                           "cause": "GPU fell off the bus (XID 79)"})
    wait_until("the receiver to get the event", lambda: receiver.events, timeout=30)
    assert receiver.bad_signatures == 0
    assert receiver.events[0]["id"] == event.id
    assert receiver.events[0]["data"]["cause"] == "GPU fell off the bus (XID 79)"
    row = wait_until("the delivery to be recorded",
                     lambda: WebhookDelivery.objects.filter(status="delivered").first())
    assert (row.attempts, row.last_status_code) == (1, 200)


def test_a_receiver_down_for_a_while_gets_every_event_once_it_is_back(webhook_worker,
                                                                      receiver_factory):
    receiver = receiver_factory(start=False)  # down: nothing listens on its port yet
    user, _ = _endpoint(receiver)
    sent = [emit(user.pk, "lease.started", {"lease": n}).id for n in range(6)]
    wait_until("every delivery to have failed twice", lambda: WebhookDelivery.objects.filter(
        attempts__gte=2).count() == 6, timeout=60)
    assert WebhookDelivery.objects.filter(status="pending").count() == 6
    receiver.start()
    wait_until("every event to arrive", lambda: set(receiver.ids()) == set(sent), timeout=60)
    wait_until("every delivery to be recorded delivered",
               lambda: WebhookDelivery.objects.filter(status="delivered").count() == 6)
    assert sorted(receiver.ids()) == sorted(sent)  # each exactly once
    assert receiver.bad_signatures == 0


def test_a_receiver_that_hangs_does_not_delay_another_endpoint(webhook_worker,
                                                               receiver_factory):
    hanging, healthy = receiver_factory(), receiver_factory()
    hanging.hang = threading.Event()
    slow_user, _ = _endpoint(hanging)
    for n in range(3):  # a queue of events behind the hanging one
        emit(slow_user.pk, "lease.started", {"lease": n})
    wait_until("the hanging receiver to be called", hanging.arrived.is_set, timeout=30)
    fast_user, _ = _endpoint(healthy)
    event = emit(fast_user.pk, "lease.started", {"lease": 100})
    wait_until("the healthy receiver to get its event", lambda: healthy.events, timeout=30)
    assert healthy.ids() == [event.id]
    assert hanging.events == []  # still held: the healthy endpoint did not wait for it
    hanging.hang.set()
    wait_until("the hanging receiver's events once it answers",
               lambda: len(set(hanging.ids())) == 3, timeout=60)


def test_an_alert_rule_fires_a_signed_webhook_from_the_worker(webhook_worker,
                                                              receiver_factory):
    provider, node, token = registered_node()
    receiver = receiver_factory()
    _, receiver.secret = services.create_endpoint(user_id=provider.pk, url=receiver.url,
                                                  events=["alert.fired"])
    made = client_for(provider).post("/api/v1/alert-rules/", {
        "name": "hot", "expression": "gpu_temperature > 85"}, format="json")
    assert made.status_code == 201, made.content
    uuid = node.gpus.order_by("pci_bus_id").first().uuid
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "runtime": "docker", "gpus": [{"uuid": uuid, "temperature_c": 91}]}, format="json")
    assert r.status_code == 200, r.content
    wait_until("the alert's webhook", lambda: receiver.events, timeout=60)
    assert receiver.bad_signatures == 0
    [fired] = receiver.events
    assert fired["type"] == "alert.fired" and fired["data"]["node"] == node.pk
    assert fired["data"]["values"]["gpu_temperature"] == 91
    assert AlertIncident.objects.get().subject == f"node:{node.pk}"
