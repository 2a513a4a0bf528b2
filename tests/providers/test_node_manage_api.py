"""Renaming and retiring a node through the API (PATCH /api/v1/nodes/<id>/, POST
/api/v1/nodes/<id>/retire/): bad names are 400s naming `name`; retiring is refused while
the node has an active lease or an open auction (409 naming `node`, nothing changed);
a retired node's asks are cancelled, its runner gets 401, it is listed nowhere, and its
leases and their earnings stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, leases
from marketplace.models import Auction, Lease, Order
from providers.models import Node
from settlement import services as ledger
from tests.factories import (
    RTX4090_DUMP,
    ask,
    ask_body,
    bid,
    funded_buyer,
    registered_node,
)
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def mine():
    user, node, token = registered_node()
    return user, node, token, client_for(user)


def test_rename_answers_the_node_with_its_new_name(mine):
    _, node, _, api = mine
    r = api.patch(f"/api/v1/nodes/{node.pk}/", {"name": "  rack-7 "}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["name"] == "rack-7" and r.json()["id"] == node.pk
    assert Node.objects.get(pk=node.pk).name == "rack-7"
    assert api.get(f"/api/v1/nodes/{node.pk}/").json()["name"] == "rack-7"


@pytest.mark.parametrize(("body", "contains"), [
    ({"name": ""}, "blank"),
    ({"name": "   "}, "blank"),
    ({"name": "x" * 101}, "100"),
    ({"name": 7}, "must be a string"),
    ({"name": None}, "null"),
    ({}, "required"),
    ({"name": "gpu\u202egnp.exe"}, "U+202E"),  # a bidi override: shows reversed
    ({"name": "a\u200bb"}, "control or formatting"),  # zero-width space
    ({"name": "a\x07b"}, "control or formatting"),
])
def test_bad_names_are_400_naming_name(mine, body, contains):
    _, node, _, api = mine
    r = api.patch(f"/api/v1/nodes/{node.pk}/", body, format="json")
    assert_refused(r, "name", contains=contains)
    assert Node.objects.get(pk=node.pk).name == "node-1"


def test_a_name_another_of_your_nodes_has_is_400_and_unknown_fields_too(mine):
    user, node, _, api = mine
    registered_node(RTX4090_DUMP, name="other", user=user)
    assert_refused(api.patch(f"/api/v1/nodes/{node.pk}/", {"name": "other"}, format="json"),
                   "name", contains="already have a node named 'other'")
    assert_refused(api.patch(f"/api/v1/nodes/{node.pk}/", {"name": "a", "hostname": "h"},
                             format="json"), "hostname")
    assert Node.objects.get(pk=node.pk).name == "node-1"


def test_another_providers_node_is_404_for_rename_and_retire(mine):
    _, node, token, _ = mine
    stranger = client_for(registered_node(RTX4090_DUMP, name="theirs")[0])
    assert stranger.patch(f"/api/v1/nodes/{node.pk}/", {"name": "mine"},
                          format="json").status_code == 404
    assert stranger.post(f"/api/v1/nodes/{node.pk}/retire/").status_code == 404
    assert stranger.get(f"/api/v1/nodes/{node.pk}/").status_code == 404
    assert Node.objects.get(pk=node.pk).retired_at is None
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_a_runner_token_cannot_retire_its_node(mine):
    _, node, token, _ = mine
    assert runner_client(token).post(f"/api/v1/nodes/{node.pk}/retire/").status_code in (401, 403)
    assert Node.objects.get(pk=node.pk).retired_at is None


def test_retire_is_refused_while_a_lease_is_active(mine):
    user, node, token, api = mine
    buyer = funded_buyer()
    standing = ask(user, node, gpus=8).order
    [lease] = bid(buyer, gpus=1).leases
    before = snapshot(user, buyer)

    r = api.post(f"/api/v1/nodes/{node.pk}/retire/")

    body = assert_refused(r, "node", status=409, contains=f"1 active lease (#{lease.pk})")
    assert "once it ends" in body["detail"]
    assert snapshot(user, buyer) == before
    assert Node.objects.get(pk=node.pk).retired_at is None
    assert Order.objects.get(pk=standing.pk).status in Order.ACTIVE
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200
    # once the lease is over, the same call retires it
    leases.mark_running(lease=lease, container_id="c" * 64)
    from marketplace.lease_control import stop_lease
    stop_lease(buyer_id=buyer.pk, lease_id=lease.pk)
    assert api.post(f"/api/v1/nodes/{node.pk}/retire/").status_code == 200


def test_retire_is_refused_while_an_auction_is_open(mine):
    user, node, _, api = mine
    lot = auctions.open_auction(provider_id=user.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    assert_refused(api.post(f"/api/v1/nodes/{node.pk}/retire/"), "node", status=409,
                   contains=f"open sealed-bid auction (#{lot.pk})")
    assert Auction.objects.get(pk=lot.pk).status == "open"
    assert Node.objects.get(pk=node.pk).retired_at is None


def test_retiring_cancels_the_asks_kills_the_token_and_hides_the_node(mine):
    user, node, token, api = mine
    buyer = funded_buyer()
    # a lease that ended: its history and the provider's earnings must stay
    first_ask = ask(user, node, gpus=4).order
    [done] = bid(buyer, gpus=1).leases
    leases.mark_running(lease=done, container_id="d" * 64,
                        now=timezone.now() - timedelta(seconds=60))
    from marketplace.lease_control import stop_lease
    done = stop_lease(buyer_id=buyer.pk, lease_id=done.pk)
    earned = ledger.wallet(user_id=user.pk).earned
    assert done.cost and earned
    second = api.post("/api/v1/orders/", ask_body(node, gpus=2), format="json")
    assert second.status_code == 201, second.content
    held_before = ledger.wallet(user_id=buyer.pk)

    r = api.post(f"/api/v1/nodes/{node.pk}/retire/")

    assert r.status_code == 200, r.content
    body = r.json()
    assert body["node"]["retired_at"] and body["node"]["id"] == node.pk
    assert sorted(body["cancelled_asks"]) == sorted([first_ask.pk, second.json()["id"]])
    assert set(Order.objects.filter(node=node, side="ask").values_list("status", flat=True)) \
        == {"cancelled"}
    assert ledger.wallet(user_id=buyer.pk) == held_before  # an ask holds nothing
    # the runner is refused, on every endpoint, with the one 401
    runner = runner_client(token)
    for call in (lambda: runner.get("/api/v1/runner/leases/"),
                 lambda: runner.post("/api/v1/runner/heartbeat/", {"runtime": "docker"},
                                     format="json")):
        answer = call()
        assert answer.status_code == 401 and "not valid" in answer.json()["detail"]
    # listed nowhere, but its own page and history stay
    assert [n["id"] for n in api.get("/api/v1/nodes/").json()["results"]] == []
    assert api.get(f"/api/v1/nodes/{node.pk}/").json()["retired_at"]
    assert Lease.objects.get(pk=done.pk).cost == done.cost
    assert ledger.wallet(user_id=user.pk).earned == earned
    # retiring again changes nothing; it takes no asks, no auctions, no new name, no token
    again = api.post(f"/api/v1/nodes/{node.pk}/retire/")
    assert again.status_code == 200 and again.json()["cancelled_asks"] == []
    assert_refused(api.post("/api/v1/orders/", ask_body(node), format="json"), "node",
                   status=409, contains="retired")
    assert_refused(api.post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 1, "reserve_price": "1.00", "hours": 1,
        "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json"),
        "node", status=409, contains="retired")
    assert_refused(api.patch(f"/api/v1/nodes/{node.pk}/", {"name": "x"}, format="json"),
                   "node", status=409, contains="retired")
    assert_refused(api.post(f"/api/v1/nodes/{node.pk}/rotate-token/"), "node", status=409,
                   contains="retired")
