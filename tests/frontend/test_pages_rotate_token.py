"""The node page's "Rotate runner token": a POST form with CSRF and a confirmation box; the
new token shown once (not cached), the old one refused at once, "token rotated at …" on
the node page and in the admin, never the token."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from providers.models import Node, hash_token
from tests.factories import RTX4090_DUMP, UserFactory, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import client_for, runner_client

pytestmark = pytest.mark.django_db

TOKEN = re.compile(r'id="runner-token"[^>]*value="([^"]+)"')


@pytest.fixture
def provider(client):
    user, node, token = registered_node()
    login(client, user)
    return user, node, token


def _csrf_client(user) -> Client:
    c = Client(enforce_csrf_checks=True)
    login(c, user)
    return c


def _csrf_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def test_the_node_page_has_the_button_in_a_post_form_with_csrf(client, provider):
    _, node, _ = provider
    html = client.get(reverse("node", args=[node.pk])).content.decode()
    form = re.search(r'<form[^>]*action="([^"]+)"[^>]*>(.*?)</form>',
                     html[html.index('id="token-h"'):], re.S)
    assert form.group(1) == reverse("node-rotate-token-page", args=[node.pk])
    assert 'method="post"' in form.group(0)
    assert 'name="csrfmiddlewaretoken"' in form.group(2)
    assert 'type="checkbox" name="confirm"' in form.group(2)
    assert "Rotate runner token</button>" in form.group(2)
    assert "Never rotated" in html


def test_rotating_shows_the_new_token_once_and_the_old_one_stops(provider):
    user, node, old = provider
    c = _csrf_client(user)
    page = c.get(reverse("node", args=[node.pk])).content.decode()

    r = c.post(reverse("node-rotate-token-page", args=[node.pk]),
               {"confirm": "on", "csrfmiddlewaretoken": _csrf_token(page)})

    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    html = r.content.decode()
    new = TOKEN.search(html).group(1)
    node.refresh_from_db()
    assert hash_token(new) == node.token_hash and new != old
    assert f"gpumarket-runner register --url http://testserver --token {new}" in html
    assert "previous token stopped working" in html
    assert old not in html
    assert runner_client(old).get("/api/v1/runner/leases/").status_code == 401
    assert runner_client(new).get("/api/v1/runner/leases/").status_code == 200
    # never again: the node page says when, and shows neither token
    again = c.get(reverse("node", args=[node.pk])).content.decode()
    assert new not in again and old not in again
    assert f"Token rotated at {node.token_rotated_at:%Y-%m-%d %H:%M:%S} UTC" in again
    assert new not in c.get(reverse("portal")).content.decode()


def test_without_the_csrf_token_nothing_changes(provider):
    user, node, token = provider
    before = Node.objects.get(pk=node.pk).token_hash
    r = _csrf_client(user).post(reverse("node-rotate-token-page", args=[node.pk]),
                                {"confirm": "on"})
    assert r.status_code == 403
    assert TOKEN.search(r.content.decode()) is None
    assert Node.objects.get(pk=node.pk).token_hash == before
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_the_api_with_a_session_needs_the_csrf_token_too(provider):
    user, node, token = provider
    r = _csrf_client(user).post(f"/api/v1/nodes/{node.pk}/rotate-token/")
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_without_the_confirmation_box_nothing_changes(client, provider):
    _, node, token = provider
    r = client.post(reverse("node-rotate-token-page", args=[node.pk]), {})
    assert r.status_code == 400
    html = r.content.decode()
    assert "tick the box to confirm" in field_error(html, "confirm")
    assert TOKEN.search(html) is None
    node.refresh_from_db()
    assert node.token_rotated_at is None
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_get_does_not_rotate(client, provider):
    _, node, token = provider
    assert client.get(reverse("node-rotate-token-page", args=[node.pk])).status_code == 405
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_another_providers_node_is_404(client, provider):
    _, other, token = registered_node(RTX4090_DUMP, name="theirs")
    r = client.post(reverse("node-rotate-token-page", args=[other.pk]), {"confirm": "on"})
    assert r.status_code == 404
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200
    login(client, UserFactory())  # no provider at all
    assert client.post(reverse("node-rotate-token-page", args=[other.pk]),
                       {"confirm": "on"}).status_code == 404
    assert Node.objects.get(pk=other.pk).token_rotated_at is None


def test_the_admin_shows_when_it_was_rotated_and_never_the_token(provider):
    user, node, _ = provider
    new = client_for(user).post(f"/api/v1/nodes/{node.pk}/rotate-token/").json()[
        "runner_token"]
    node.refresh_from_db()
    admin = Client()
    admin.force_login(UserFactory(is_staff=True, is_superuser=True))
    change = admin.get(reverse("admin:providers_node_change", args=[node.pk]))
    listing = admin.get(reverse("admin:providers_node_changelist"))
    assert change.status_code == 200 == listing.status_code
    for html in (change.content.decode(), listing.content.decode()):
        assert "Token rotated at" in html or "token rotated at" in html.lower()
        assert new not in html and node.token_hash not in html
    assert "token_hash" not in change.content.decode()
