"""The webhooks page: add an endpoint (its secret shown in that answer only, never on
the page again), a refused URL next to its field (400, nothing written), the "Send test
event" button and the delivery log, delete; another user's endpoint untouchable."""

from __future__ import annotations

import pytest
from django.urls import reverse

from alerts.models import AlertRule
from tests.factories import funded_buyer
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.webhooks import receiver_factory  # noqa: F401 (a fixture)
from webhooks import services
from webhooks.delivery import deliver_due
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def test_add_an_endpoint_see_its_secret_once_send_a_test_event_and_read_the_log(
        client, settings, receiver_factory):  # noqa: F811 (the imported fixture)
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True
    receiver = receiver_factory()
    user = login(client, funded_buyer(10))
    r = client.post(reverse("webhook-add-page"),
                    {"url": receiver.url, "events": ["lease.started", "lease.failed"]})
    assert r.status_code == 201
    endpoint = WebhookEndpoint.objects.get(user=user)
    html = r.content.decode()
    secret = html.split('id="signing-secret" class="token" readonly value="')[1].split('"')[0]
    assert secret.startswith("whsec_")
    receiver.secret = secret
    page = client.get(reverse("webhooks-page")).content.decode()
    assert receiver.url.replace("&", "&amp;") in page and secret not in page

    r = client.post(reverse("webhook-test-page", args=[endpoint.pk]))
    assert r.status_code == 302 and r["Location"] == reverse("webhooks-page")
    deliver_due(endpoint.pk)  # what the worker does (tests/webhooks/test_worker.py)
    [got] = receiver.events
    assert got["type"] == "webhook.test"
    page = client.get(reverse("webhooks-page")).content.decode()
    row = page.split(f'id="delivery-{got["id"]}-{endpoint.pk}"')[1].split("</tr>")[0]
    assert "webhook.test" in row and "delivered" in row and "HTTP 200" in row
    assert secret not in page

    r = client.post(reverse("webhook-delete-page", args=[endpoint.pk]))
    assert r.status_code == 302
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


def test_a_private_url_is_refused_next_to_its_field_and_nothing_is_written(client):
    login(client, funded_buyer(10))
    r = client.post(reverse("webhook-add-page"),
                    {"url": "http://127.0.0.1:8000/", "events": ["lease.started"]})
    assert r.status_code == 400
    assert "private or loopback" in field_error(r.content.decode(), "url")
    assert 'id="signing-secret"' not in r.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_another_users_endpoint_cannot_be_tested_or_deleted(client, settings):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True
    owner = funded_buyer(10)
    endpoint, _ = services.create_endpoint(user_id=owner.pk, url="http://127.0.0.1:9/",
                                           events=["lease.started"])
    login(client, funded_buyer(10))
    client.post(reverse("webhook-test-page", args=[endpoint.pk]))
    client.post(reverse("webhook-delete-page", args=[endpoint.pk]))
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert not WebhookDelivery.objects.exists()
    assert endpoint.url not in client.get(reverse("webhooks-page")).content.decode()


def test_add_an_alert_rule_a_bad_one_shown_with_its_position_and_delete_it(client):
    user = login(client, funded_buyer(10))
    r = client.post(reverse("alert-rule-add-page"),
                    {"name": "hot", "expression": "gpu_temperature > 85 FOR 2x"})
    assert r.status_code == 400
    assert "at position 27: expected s, m, h or d" in field_error(r.content.decode(),
                                                                   "expression")
    assert not AlertRule.objects.exists()
    r = client.post(reverse("alert-rule-add-page"),
                    {"name": "hot", "expression": "gpu_temperature > 85 FOR 2m"})
    assert r.status_code == 302
    rule = AlertRule.objects.get(user=user)
    assert rule.conditions == [{"metric": "gpu_temperature", "op": ">", "threshold": "85",
                                "unit": "C", "for_seconds": 120}]
    assert "gpu_temperature &gt; 85 FOR 2m" in client.get(reverse("webhooks-page")).content.decode()
    client.post(reverse("alert-rule-delete-page", args=[rule.pk]))
    assert not AlertRule.objects.exists()
