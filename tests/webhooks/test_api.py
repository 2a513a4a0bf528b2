"""The webhooks API: the secret shown once and stored sealed, refused URLs and event
types (400 naming the field, nothing written), another user's endpoint a 404, the
delivery log and the test button."""

from __future__ import annotations

import pytest

from tests.factories import UserFactory
from tests.support.api import assert_refused, body_text, client_for
from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

pytestmark = pytest.mark.django_db


def _create(client, url="http://127.0.0.1:9/hook", events=("lease.started",)):
    return client.post("/api/v1/webhooks/", {"url": url, "events": list(events)},
                       format="json")


def test_the_signing_secret_is_shown_once_and_stored_sealed(allow_private):
    user = UserFactory()
    client = client_for(user)
    made = _create(client, events=["lease.started", "lease.failed"])
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert made.json()["events"] == ["lease.failed", "lease.started"]
    endpoint = WebhookEndpoint.objects.get()
    assert secret not in endpoint.secret_sealed and endpoint.user == user
    for later in (client.get("/api/v1/webhooks/"),
                  client.get(f"/api/v1/webhooks/{endpoint.pk}/"),
                  client.patch(f"/api/v1/webhooks/{endpoint.pk}/", {"enabled": False},
                               format="json")):
        assert later.status_code == 200, later.content
        assert secret not in body_text(later) and "secret" not in body_text(later)
    assert WebhookEndpoint.objects.get().enabled is False


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:8000/hook", "private or loopback address (127.0.0.1)"),
    ("http://localhost/hook", "private or loopback address"),
    ("https://10.1.2.3/hook", "private or loopback address (10.1.2.3)"),
    ("http://169.254.169.254/latest/meta-data/", "private or loopback address"),
    ("http://[::1]:8000/", "private or loopback address (::1)"),
    ("http://[::ffff:192.168.0.1]/", "private or loopback address"),
    ("ftp://example.com/hook", "must be an http:// or https:// URL"),
    ("http://user:pw@example.com/", "must not carry credentials"),
    ("http:///nohost", "must name a host"),
    ("http://" + "a" * 64 + ".example/", "does not resolve"),  # refused before any DNS query
])
def test_a_url_that_is_not_a_public_http_target_is_refused(url, says):
    client = client_for(UserFactory())
    assert_refused(_create(client, url=url), "url", contains=says)
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.parametrize(("events", "field", "says"), [
    ([], "events", "at least one"),
    (["lease.exploded"], "events", "unknown event type 'lease.exploded'"),
    (["webhook.test"], "events", "sent only by an endpoint's test button"),
    ("lease.started", "events", "list"),
    ([5], "events[0]", "string"),
])
def test_an_unknown_or_malformed_event_list_is_refused(events, field, says, allow_private):
    client = client_for(UserFactory())
    response = client.post("/api/v1/webhooks/", {"url": "http://127.0.0.1/", "events": events},
                           format="json")
    assert_refused(response, field)
    assert says in body_text(response)
    assert WebhookEndpoint.objects.count() == 0


def test_an_unknown_field_is_refused_naming_it(allow_private):
    response = client_for(UserFactory()).post(
        "/api/v1/webhooks/", {"url": "http://127.0.0.1/", "events": ["lease.started"],
                              "secret": "mine"}, format="json")
    assert_refused(response, "secret", contains="not a known field")


def test_a_changed_url_is_checked_again(settings):
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = True
    client = client_for(UserFactory())
    pk = _create(client).json()["id"]
    settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE = False
    response = client.patch(f"/api/v1/webhooks/{pk}/", {"url": "http://127.0.0.2/"},
                            format="json")
    assert_refused(response, "url", contains="private")
    assert WebhookEndpoint.objects.get().url == "http://127.0.0.1:9/hook"


def test_another_users_endpoint_is_a_404_everywhere(allow_private):
    owner, other = UserFactory(), UserFactory()
    pk = _create(client_for(owner)).json()["id"]
    client = client_for(other)
    for response in (client.get(f"/api/v1/webhooks/{pk}/"),
                     client.patch(f"/api/v1/webhooks/{pk}/", {"enabled": False}, format="json"),
                     client.get(f"/api/v1/webhooks/{pk}/deliveries/"),
                     client.post(f"/api/v1/webhooks/{pk}/test/"),
                     client.delete(f"/api/v1/webhooks/{pk}/")):
        assert response.status_code == 404, response.content
    assert client.get("/api/v1/webhooks/").json() == {"count": 0, "next": None,
                                                      "previous": None, "results": []}
    assert WebhookEndpoint.objects.filter(pk=pk, enabled=True).exists()
    assert WebhookEvent.objects.count() == 0


def test_the_test_button_queues_one_event_for_that_endpoint_and_the_log_shows_it(
        allow_private):
    user = UserFactory()
    client = client_for(user)
    first = _create(client).json()["id"]
    _create(client)  # a second endpoint of the same user gets nothing
    sent = client.post(f"/api/v1/webhooks/{first}/test/")
    assert sent.status_code == 202, sent.content
    event_id = sent.json()["event_id"]
    assert event_id.startswith("evt_")
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.endpoint_id == first and delivery.event_id == event_id
    log = client.get(f"/api/v1/webhooks/{first}/deliveries/")
    assert log.status_code == 200
    [row] = log.json()["results"]
    assert (row["event_id"], row["type"], row["status"], row["attempts"]) == (
        event_id, "webhook.test", "pending", 0)


def test_the_test_button_of_a_disabled_endpoint_is_a_conflict_and_sends_nothing(
        allow_private):
    client = client_for(UserFactory())
    pk = _create(client).json()["id"]
    assert client.patch(f"/api/v1/webhooks/{pk}/", {"enabled": False},
                        format="json").status_code == 200
    assert_refused(client.post(f"/api/v1/webhooks/{pk}/test/"), "enabled", status=409,
                   contains="enable it first")
    assert WebhookEvent.objects.count() == 0


def test_a_refused_event_type_is_named_once_not_prefixed_twice(allow_private):
    body = client_for(UserFactory()).post(
        "/api/v1/webhooks/", {"url": "http://127.0.0.1/", "events": ["lease.exploded"]},
        format="json").json()
    assert body["errors"]["events"][0].startswith("unknown event type 'lease.exploded'")
    assert body["detail"].count("events") == 1


def test_the_endpoint_list_pages_like_every_list(allow_private):
    client = client_for(UserFactory())
    made = [_create(client).json()["id"] for _ in range(3)]
    body = client.get("/api/v1/webhooks/", {"limit": 2}).json()
    assert body["count"] == 3 and body["next"] and body["previous"] is None
    assert [e["id"] for e in body["results"]] == made[:2]
    assert_refused(client.get("/api/v1/webhooks/", {"enabled": "1"}), "enabled")


@pytest.mark.parametrize(("params", "field"), [({"limit": "0"}, "limit"),
                                               ({"offset": "x"}, "offset")])
def test_the_delivery_log_pages_like_every_list(params, field, allow_private):
    client = client_for(UserFactory())
    pk = _create(client).json()["id"]
    for _ in range(3):
        client.post(f"/api/v1/webhooks/{pk}/test/")
    body = client.get(f"/api/v1/webhooks/{pk}/deliveries/", {"limit": 2}).json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]
    assert_refused(client.get(f"/api/v1/webhooks/{pk}/deliveries/", params), field)


def test_deleting_an_endpoint_removes_it_and_its_log(allow_private):
    client = client_for(UserFactory())
    pk = _create(client).json()["id"]
    client.post(f"/api/v1/webhooks/{pk}/test/")
    assert client.delete(f"/api/v1/webhooks/{pk}/").status_code == 204
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


def test_an_anonymous_client_is_refused():
    assert client_for().get("/api/v1/webhooks/").status_code in (401, 403)


def test_secrets_reseal_moves_the_signing_secret_to_the_first_key(settings, allow_private):
    import io

    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from marketplace.sealing import unseal_text

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GPUMARKET_SECRETS_KEYS = [old]
    secret = _create(client_for(UserFactory())).json()["secret"]
    settings.GPUMARKET_SECRETS_KEYS = [new, old]
    out = io.StringIO()
    call_command("secrets_reseal", stdout=out)
    assert "WebhookEndpoint.secret_sealed: 1 re-sealed" in out.getvalue()
    assert secret not in out.getvalue()
    settings.GPUMARKET_SECRETS_KEYS = [new]  # the old key gone: it still opens
    assert unseal_text(WebhookEndpoint.objects.get().secret_sealed) == secret
