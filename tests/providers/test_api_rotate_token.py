"""Runner token rotation through the API: POST /api/v1/nodes/<id>/rotate-token/ gives the
node a new token (shown once, only its hash stored) and the old one is refused at once on
every runner endpoint; only the node's provider may rotate it, and never with a runner
token."""

from __future__ import annotations

import pytest
from django.db import connection

from providers.auth import INVALID_TOKEN
from providers.models import Node, hash_token
from providers.runner.nvsmi import parse_dump
from tests.factories import H100_DUMP, RTX4090_DUMP, UserFactory, registered_node
from tests.support.api import client_for, runner_client

pytestmark = pytest.mark.django_db


def _inventory() -> dict:
    inv = parse_dump(H100_DUMP)
    return {"hostname": "node-1", "driver_version": inv.driver_version,
            "cuda_version": inv.cuda_version, "runner_version": "test",
            "gpus": [g.as_protocol() for g in inv.gpus]}


def _runner_calls(token: str) -> dict[str, int]:
    """The status of each runner endpoint called with `token`."""
    c = runner_client(token)
    return {
        "heartbeat": c.post("/api/v1/runner/heartbeat/", {"runtime": "docker", "gpus": []},
                            format="json").status_code,
        "leases": c.get("/api/v1/runner/leases/").status_code,
        "inventory": c.post("/api/v1/runner/inventory/", _inventory(),
                            format="json").status_code,
    }


def _rotate(user, node_id: int):
    return client_for(user).post(f"/api/v1/nodes/{node_id}/rotate-token/")


def test_rotation_refuses_the_old_token_at_once_and_the_new_one_works():
    user, node, old = registered_node(H100_DUMP)
    assert _runner_calls(old) == {"heartbeat": 200, "leases": 200, "inventory": 200}

    r = _rotate(user, node.pk)

    assert r.status_code == 200, r.content
    assert r["Cache-Control"] == "no-store"
    body = r.json()
    new = body["runner_token"]
    assert new.startswith("gmr_") and new != old
    assert body["id"] == node.pk and body["name"] == node.name and body["token_rotated_at"]
    assert _runner_calls(new) == {"heartbeat": 200, "leases": 200, "inventory": 200}
    assert _runner_calls(old) == {"heartbeat": 401, "leases": 401, "inventory": 401}
    refused = runner_client(old).get("/api/v1/runner/leases/")
    assert refused.json() == {"detail": INVALID_TOKEN}
    assert "rotated" in INVALID_TOKEN and refused["WWW-Authenticate"] == "Bearer"
    # the very same answer as for a token that never existed: it tells nothing more
    assert runner_client("gmr_never-issued").get("/api/v1/runner/leases/").json() == \
        refused.json()


def test_the_new_token_is_stored_hashed_and_shown_once():
    user, node, _ = registered_node(H100_DUMP)
    new = _rotate(user, node.pk).json()["runner_token"]
    node.refresh_from_db()
    assert node.token_hash == hash_token(new) and node.token_rotated_at is not None
    with connection.cursor() as cursor:  # nowhere in the node's row, in clear
        cursor.execute("SELECT * FROM providers_node WHERE id = %s", [node.pk])
        assert new not in repr(cursor.fetchone())
    # never again: not in the node list, nor in the node of any other answer
    listed = client_for(user).get("/api/v1/nodes/")
    assert new not in listed.content.decode()
    assert listed.json()["results"][0]["token_rotated_at"] == \
        node.token_rotated_at.isoformat().replace("+00:00", "Z")
    assert new not in runner_client(new).post("/api/v1/runner/inventory/", _inventory(),
                                              format="json").content.decode()


def test_rotating_again_refuses_every_earlier_token():
    user, node, first = registered_node(H100_DUMP)
    second = _rotate(user, node.pk).json()["runner_token"]
    third = _rotate(user, node.pk).json()["runner_token"]
    statuses = [runner_client(t).get("/api/v1/runner/leases/").status_code
                for t in (first, second, third)]
    assert statuses == [401, 401, 200]


def test_another_providers_node_is_404_and_keeps_its_token():
    _, node, token = registered_node(H100_DUMP, name="theirs")
    stranger, _, _ = registered_node(RTX4090_DUMP, name="mine")
    before = Node.objects.get(pk=node.pk).token_hash
    r = _rotate(stranger, node.pk)
    missing = _rotate(stranger, 987654)
    assert r.status_code == 404 == missing.status_code
    assert r.json()["errors"] == {"node": [f"no node {node.pk} of yours"]}
    # a node that exists and one that does not are refused alike, but for their number
    assert missing.json()["errors"] == {"node": ["no node 987654 of yours"]}
    assert Node.objects.get(pk=node.pk).token_hash == before
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200
    # a user who is no provider at all: the same 404
    assert _rotate(UserFactory(), node.pk).status_code == 404


def test_a_runner_token_cannot_rotate_and_anonymous_cannot_either():
    _, node, token = registered_node(H100_DUMP)
    before = Node.objects.get(pk=node.pk).token_hash
    r = runner_client(token).post(f"/api/v1/nodes/{node.pk}/rotate-token/")
    assert r.status_code in (401, 403) and r.json()["detail"]
    assert "runner_token" not in r.json()
    r = client_for().post(f"/api/v1/nodes/{node.pk}/rotate-token/")
    assert r.status_code in (401, 403) and "runner_token" not in r.json()
    after = Node.objects.get(pk=node.pk)
    assert after.token_hash == before and after.token_rotated_at is None
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_only_post_rotates():
    user, node, token = registered_node(H100_DUMP)
    r = client_for(user).get(f"/api/v1/nodes/{node.pk}/rotate-token/")
    assert r.status_code == 405
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_node_creation_answer_is_not_cached():
    from providers.services import provider_onboard

    user = UserFactory()
    provider_onboard(user_id=user.pk, display_name="Acme")
    r = client_for(user).post("/api/v1/nodes/", {"name": "box"}, format="json")
    assert r.status_code == 201 and r["Cache-Control"] == "no-store"
    assert r.json()["token_rotated_at"] is None
