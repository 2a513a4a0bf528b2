"""Who may call what: anonymous users, runner tokens and user tokens kept apart."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from providers import services as provider_services
from providers.auth import INVALID_TOKEN
from tests.factories import H100_DUMP, RTX4090_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db

BID = {"side": "bid", "gpu_class": "rtx-4090", "price": "1.50", "gpus": 2, "hours": 1}
RUNNER_CALLS = [
    ("get", "/api/v1/runner/leases/", None),
    ("post", "/api/v1/runner/heartbeat/", {"runtime": "docker", "gpus": []}),
    ("post", "/api/v1/runner/inventory/", {"driver_version": "535", "gpus": []}),
    ("post", "/api/v1/runner/leases/1/events/", {"status": "starting"}),
]


def _lease_on(node, provider, buyer):
    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "1.50", "gpus": 2,
        "available_until": in_a_day().isoformat()}, format="json")
    assert r.status_code == 201, r.content
    r = client_for(buyer).post("/api/v1/orders/", BID, format="json")
    assert r.status_code == 201, r.content
    (lease_id,) = r.json()["leases"]
    return lease_id


def test_anonymous_cannot_place_orders():
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    client = APIClient()
    r = client.post("/api/v1/orders/", BID, format="json")
    assert r.status_code in (401, 403)
    assert "detail" in r.json()
    assert snapshot(buyer) == before
    for url in ("/api/v1/orders/", "/api/v1/wallet/", "/api/v1/sealed-bids/",
                "/api/v1/leases/", "/api/v1/ledger/entries/"):
        assert client.get(url).status_code in (401, 403), url


def test_wrong_user_token_is_refused():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    r = client.post("/api/v1/orders/", BID, format="json")
    assert r.status_code == 401
    assert r.json()["detail"]


@pytest.mark.parametrize(("method", "url", "body"), RUNNER_CALLS)
def test_runner_endpoints_refuse_an_unknown_bearer_token(method, url, body):
    registered_node(RTX4090_DUMP)
    r = getattr(runner_client("not-a-real-runner-token"), method)(url, body, format="json")
    assert r.status_code == 401
    assert r.json()["detail"] == INVALID_TOKEN
    assert r["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "url", "body"), RUNNER_CALLS)
def test_runner_endpoints_refuse_a_malformed_bearer_header(method, url, body):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer two words")
    r = getattr(client, method)(url, body, format="json")
    assert r.status_code == 401
    assert "malformed" in r.json()["detail"]


@pytest.mark.parametrize(("method", "url", "body"), RUNNER_CALLS)
def test_runner_endpoints_refuse_a_user_token(method, url, body):
    # the provider's own user token is not a runner token
    provider, _, _ = registered_node(RTX4090_DUMP)
    r = getattr(client_for(provider), method)(url, body, format="json")
    assert r.status_code in (401, 403)
    assert r.json()["detail"]
    # and anonymous is refused the same way
    r = getattr(APIClient(), method)(url, body, format="json")
    assert r.status_code in (401, 403)


def test_runner_token_is_not_a_user_token():
    _, _, runner_token = registered_node(RTX4090_DUMP)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {runner_token}")
    assert client.post("/api/v1/orders/", BID, format="json").status_code in (401, 403)
    client.credentials(HTTP_AUTHORIZATION=f"Token {runner_token}")
    assert client.get("/api/v1/wallet/").status_code == 401


def test_runner_cannot_touch_another_nodes_lease():
    provider_a, node_a, token_a = registered_node(RTX4090_DUMP, name="a")
    _, _, token_b = registered_node(H100_DUMP, name="b")
    buyer = funded_buyer(100)
    lease_id = _lease_on(node_a, provider_a, buyer)

    other = runner_client(token_b)
    for status in ("starting", "running", "completed", "failed"):
        r = other.post(f"/api/v1/runner/leases/{lease_id}/events/",
                       {"status": status, "container_id": "c0ffee"}, format="json")
        assert r.status_code == 404, (status, r.content)
        assert r.json()["errors"] == {"lease": [f"no lease {lease_id} on this node"]}
    assert other.get("/api/v1/runner/leases/").json() == {"leases": []}
    # same provider, second node: still not its lease
    node_a2 = provider_services.node_create(provider=node_a.provider, name="a2")
    r = runner_client(node_a2.runner_token).post(
        f"/api/v1/runner/leases/{lease_id}/events/", {"status": "starting"}, format="json")
    assert r.status_code == 404
    # the lease is untouched and its own runner still sees it
    own = runner_client(token_a).get("/api/v1/runner/leases/").json()["leases"]
    assert [(lease["id"], lease["status"]) for lease in own] == [(lease_id, "pending")]


def test_rotated_runner_token_stops_working():
    user, node, token = registered_node(RTX4090_DUMP)
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200
    new = provider_services.node_rotate_token(user_id=user.pk, node_id=node.pk).runner_token
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 401
    assert runner_client(new).get("/api/v1/runner/leases/").status_code == 200


def test_other_users_orders_and_leases_are_hidden():
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer, stranger = funded_buyer(100), funded_buyer(100)
    lease_id = _lease_on(node, provider, buyer)
    order_id = client_for(buyer).get("/api/v1/orders/").json()["results"][0]["id"]
    s = client_for(stranger)
    assert s.get(f"/api/v1/orders/{order_id}/").status_code == 404
    assert s.get(f"/api/v1/leases/{lease_id}/").status_code == 404
    assert s.post(f"/api/v1/orders/{order_id}/cancel/").status_code == 404
    assert client_for(buyer).get(f"/api/v1/leases/{lease_id}/").status_code == 200
    assert client_for(provider).get(f"/api/v1/leases/{lease_id}/").status_code == 200
