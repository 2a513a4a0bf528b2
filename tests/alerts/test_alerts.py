"""Alert rules end to end in this process: the API (400 naming `expression` and the
position), the worker's evaluation on a running lease fed by real heartbeats (FOR
respected with explicit times), firing and resolving recorded, a signed `alert.fired`
webhook delivered to a receiver on 127.0.0.1 that verifies it, and email."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from alerts.evaluate import evaluate_all
from alerts.models import AlertIncident, AlertRule
from marketplace import book
from marketplace.leases import mark_running
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.api import assert_refused, client_for, runner_client
from tests.support.webhooks import receiver_factory  # noqa: F401 (a fixture)
from webhooks import services
from webhooks.delivery import deliver_due

pytestmark = pytest.mark.django_db


def _running_lease(t0):
    provider, node, token = registered_node()
    buyer = funded_buyer(1000)
    buyer.email = "buyer@example.com"
    buyer.save()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=2, duration_seconds=7200).leases
    mark_running(lease=lease, container_id="c" * 64, now=t0)
    return buyer, lease, token


def _heartbeat(token, lease, **reading):
    uuids = lease.lease_gpus.values_list("gpu__uuid", flat=True)
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "runtime": "docker", "gpus": [{"uuid": u, **reading} for u in uuids]}, format="json")
    assert r.status_code == 200, r.content


def test_an_expression_that_does_not_parse_is_a_400_naming_the_position():
    client = client_for(funded_buyer(1))
    r = client.post("/api/v1/alert-rules/", {"expression": "gpu_utilization < 5 USD"},
                    format="json")
    assert_refused(r, "expression", contains="at position 21: gpu_utilization takes %")
    r = client.post("/api/v1/alert-rules/", {"expression": "gpu_fan > 5"}, format="json")
    assert_refused(r, "expression", contains="at position 1: expected a metric")
    assert not AlertRule.objects.exists()


def test_an_idle_expensive_lease_fires_a_signed_webhook_and_an_email_then_resolves(
        settings, receiver_factory,  # noqa: F811 (the imported fixture)
        django_capture_on_commit_callbacks):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True
    t0 = timezone.now() - timedelta(hours=1)
    buyer, lease, token = _running_lease(t0)
    receiver = receiver_factory()
    endpoint, receiver.secret = services.create_endpoint(
        user_id=buyer.pk, url=receiver.url, events=["alert.fired", "alert.resolved"])
    client = client_for(buyer)
    made = client.post("/api/v1/alert-rules/", {
        "name": "idle", "expression": "gpu_utilization < 5% FOR 30m AND lease_cost > 1 USD"},
        format="json")
    assert made.status_code == 201, made.content
    rule_id = made.json()["id"]
    assert made.json()["conditions"][0] == {"metric": "gpu_utilization", "op": "<",
                                            "threshold": "5", "unit": "%", "for_seconds": 1800}

    _heartbeat(token, lease, utilization_pct=2, temperature_c=40)
    now = timezone.now()
    assert evaluate_all(now) == []  # idle, costly (2 GPUs × 1 h × 2 USD), but not for 30 min
    assert evaluate_all(now + timedelta(minutes=29)) == []
    with django_capture_on_commit_callbacks(execute=True):  # the mail goes after commit
        fired_now = evaluate_all(now + timedelta(minutes=30))
    assert fired_now == [f"rule {rule_id} fired lease:{lease.pk}"]
    assert evaluate_all(now + timedelta(minutes=31)) == []  # fires once
    [incident] = AlertIncident.objects.all()
    assert incident.subject == f"lease:{lease.pk}" and incident.resolved_at is None
    assert incident.values["gpu_utilization"] == 2

    deliver_due(endpoint.pk)
    [fired] = receiver.events  # the receiver verified its signature
    assert receiver.bad_signatures == 0
    assert fired["type"] == "alert.fired"
    assert fired["data"]["lease"] == lease.pk and fired["data"]["rule"] == rule_id
    [email] = mail.outbox
    assert email.to == ["buyer@example.com"] and "firing" in email.subject

    _heartbeat(token, lease, utilization_pct=97, temperature_c=70)
    with django_capture_on_commit_callbacks(execute=True):
        resolved = evaluate_all(now + timedelta(minutes=32))
    assert resolved == [f"rule {rule_id} resolved lease:{lease.pk}"]
    incident.refresh_from_db()
    assert incident.resolved_at == now + timedelta(minutes=32)
    deliver_due(endpoint.pk)
    assert [e["type"] for e in receiver.events] == ["alert.fired", "alert.resolved"]
    assert len(mail.outbox) == 2
    body = client.get(f"/api/v1/alert-rules/{rule_id}/").json()
    assert body["incidents"][0]["resolved_at"] is not None


def test_a_node_rule_watches_the_providers_nodes_and_another_user_sees_nothing():
    t0 = timezone.now()
    _buyer, lease, token = _running_lease(t0)
    provider = lease.provider
    client = client_for(provider)
    r = client.post("/api/v1/alert-rules/", {"expression": "gpu_temperature > 85"},
                    format="json")
    assert r.status_code == 201, r.content
    _heartbeat(token, lease, temperature_c=91)
    assert evaluate_all(timezone.now()) == [f"rule {r.json()['id']} fired node:{lease.node_id}"]
    other = client_for(funded_buyer(1))
    assert other.get(f"/api/v1/alert-rules/{r.json()['id']}/").status_code == 404
    assert other.get("/api/v1/alert-rules/").json() == {"count": 0, "next": None,
                                                        "previous": None, "results": []}
