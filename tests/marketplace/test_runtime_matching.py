"""What a node can run (marketplace/runtimes.py, docs/MATCHING.md "Runtimes"): a node whose
runner announces `--runtime process` runs a bid's command as a local process and cannot
run an image's own command. So a bid without a command never fills there (engine, both
directions and FOK; the book, fresh and cached; preemption), a bid no node of its market
could run is refused naming `command` before it rests (API, place_bid), a sealed bid on
such a lot too, and a sealed bid that lost its runnable node at close loses."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, engine
from marketplace.errors import InvalidInput
from marketplace.models import Lease, Order, SealedBid
from providers import services as provider_services
from settlement.models import Hold
from tests.factories import (
    RTX4090_DUMP,
    api_token,
    ask,
    bid,
    bid_body,
    funded_buyer,
    registered_node,
)
from tests.support.api import assert_refused, client_for, snapshot

NOW = 1_700_000_000
UNTIL = NOW + 86_400
CMD = ["sleep", "3600"]


def _ask(i, price, images=True, gpus=2):
    return engine.Ask(id=i, owner=100 + i, price=price, gpus=gpus, node=i,
                      available_until=UNTIL, seq=i, runs_images=images)


def _bid(i, price, image_only=False, gpus=2, tif="GTC"):
    return engine.Bid(id=i, owner=200 + i, price=price, gpus=gpus, gang=gpus,
                      duration_s=3600, seq=i, tif=tif, image_only=image_only)


def test_engine_a_bid_without_command_skips_process_nodes():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000, images=False))  # cheapest, processes only
    ob.rest_ask(_ask(2, 2_000_000))
    r = ob.submit_bid(_bid(10, 3_000_000, image_only=True), NOW)
    assert [(f.ask_id, f.price) for f in r.fills] == [(2, 2_000_000)]
    assert 1 in ob  # skipped, still there
    r = ob.submit_bid(_bid(11, 3_000_000), NOW)  # with a command: the cheapest
    assert [f.ask_id for f in r.fills] == [1]


def test_engine_an_incoming_process_ask_skips_bids_without_command():
    ob = engine.OrderBook()
    ob.rest_bid(_bid(1, 3_000_000, image_only=True))
    ob.rest_bid(_bid(2, 2_500_000))
    r = ob.submit_ask(_ask(10, 1_000_000, images=False), NOW)
    assert [f.bid_id for f in r.fills] == [2] and 1 in ob
    r = ob.submit_ask(_ask(11, 1_000_000), NOW)
    assert [f.bid_id for f in r.fills] == [1]


def test_engine_fok_counts_only_runnable_asks():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000, images=False, gpus=2))
    r = ob.submit_bid(_bid(10, 3_000_000, image_only=True, tif="FOK"), NOW)
    assert r.killed and not r.fills and 1 in ob


def _process_node(dump=RTX4090_DUMP, name="proc", user=None):
    user, node, token = registered_node(dump, name=name, user=user)
    provider_services.heartbeat_record(node=node, runtime="process", gpus=[])
    node.refresh_from_db()
    return user, node, token


@pytest.mark.django_db
def test_a_bid_without_command_is_refused_where_every_node_runs_processes():
    user, node, _ = _process_node()
    ask(user, node)
    buyer = funded_buyer()
    market = "rtx-4090"
    before = snapshot(buyer)
    api = client_for(buyer)

    r = api.post("/api/v1/orders/", bid_body(gpu_class=market, gpus=1), format="json")

    assert_refused(r, "command", contains="--runtime process")
    assert snapshot(buyer) == before  # nothing rests, nothing held
    with pytest.raises(InvalidInput) as refused:
        bid(buyer, market=market, gpus=1)
    assert refused.value.field == "command"
    # with a command it fills there
    r = api.post("/api/v1/orders/", bid_body(gpu_class=market, gpus=1, command=CMD),
                 format="json")
    assert r.status_code == 201, r.content
    assert len(r.json()["leases"]) == 1


@pytest.mark.django_db
def test_bearer_batched_bid_is_refused_the_same_way():
    """The bid batcher's path (Bearer API token) gives the same 400."""
    _process_node()
    buyer = funded_buyer()
    from rest_framework.test import APIClient
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token(buyer)}")
    r = api.post("/api/v1/orders/", bid_body(gpu_class="rtx-4090", gpus=1), format="json")
    assert_refused(r, "command")


@pytest.mark.django_db
def test_in_a_mixed_market_a_bid_without_command_fills_only_on_a_docker_node():
    user, proc, _ = _process_node(name="proc")
    _, docker, _ = registered_node(RTX4090_DUMP, name="dock", user=user, own_uuids=True)
    ask(user, proc, market="rtx-4090", price=1_000_000)
    ask(user, docker, market="rtx-4090", price=2_000_000, gpus=1)
    buyer = funded_buyer()
    placed = bid(buyer, market="rtx-4090", gpus=1, price=3_000_000)
    assert [lease.node_id for lease in placed.leases] == [docker.pk]
    # the docker node's one GPU taken: the next one rests (the process node is no offer)
    rests = bid(buyer, market="rtx-4090", gpus=1, price=3_000_000)
    assert rests.leases == []
    assert Order.objects.get(pk=rests.order.pk).status == "open"
    assert not Lease.objects.filter(node=proc, command__isnull=True).exists()


@pytest.mark.django_db
def test_a_resting_bid_without_command_is_skipped_by_a_process_ask_then_taken_by_docker():
    user, proc, _ = _process_node(name="proc")
    _, docker, _ = registered_node(RTX4090_DUMP, name="dock", user=user, own_uuids=True)
    buyer = funded_buyer()
    resting = bid(buyer, market="rtx-4090", gpus=1, price=3_000_000).order
    assert ask(user, proc, market="rtx-4090").leases == []  # cached book: skipped
    assert Order.objects.get(pk=resting.pk).status == "open"
    [lease] = ask(user, docker, market="rtx-4090").leases
    assert lease.node_id == docker.pk and lease.fill.bid_id == resting.pk


@pytest.mark.django_db
def test_a_node_that_switches_to_docker_fills_the_bids_that_waited_for_it(
        django_capture_on_commit_callbacks):
    user, proc, _ = _process_node(name="proc")
    registered_node(RTX4090_DUMP, name="dock", user=user, own_uuids=True)
    ask(user, proc, market="rtx-4090")  # a docker node exists, so the bid may rest
    buyer = funded_buyer()
    resting = bid(buyer, market="rtx-4090", gpus=1, price=3_000_000).order
    assert Order.objects.get(pk=resting.pk).status == "open"
    with django_capture_on_commit_callbacks(execute=True):  # the heartbeat commits
        provider_services.heartbeat_record(node=proc, runtime="docker", gpus=[])
    assert Order.objects.get(pk=resting.pk).status == "filled"
    assert Lease.objects.get(fill__bid=resting).node_id == proc.pk


@pytest.mark.django_db
def test_a_crossed_book_says_a_bid_without_command_waits_for_a_docker_node():
    user, proc, _ = _process_node(name="proc")
    registered_node(RTX4090_DUMP, name="dock", user=user, own_uuids=True)
    ask(user, proc, market="rtx-4090", price=1_000_000)
    bid(funded_buyer(), market="rtx-4090", gpus=1, price=3_000_000)  # rests over the ask
    from marketplace.models import GpuClass
    from marketplace.selectors import crossed_note
    note = crossed_note(GpuClass.objects.get(slug="rtx-4090").pk, 1_000_000)
    assert note == ("bids at or above the best ask rest: they need a node with Docker "
                    "(no command given) that no offer meets")


def _lot(user, node, gpus=2):
    return auctions.open_auction(provider_id=user.pk, node_id=node.pk, gpus=gpus,
                                 reserve_price=1_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


@pytest.mark.django_db
def test_a_sealed_bid_without_command_on_a_process_lot_is_400_naming_command():
    user, node, _ = _process_node()
    lot = _lot(user, node)
    buyer = funded_buyer()
    before = snapshot(buyer)
    api = client_for(buyer)
    r = api.post(f"/api/v1/auctions/{lot.pk}/bids/", {"price": "2.00"}, format="json")
    assert_refused(r, "command", contains="--runtime process")
    assert snapshot(buyer) == before
    r = api.post(f"/api/v1/auctions/{lot.pk}/bids/", {"price": "2.00", "command": CMD},
                 format="json")
    assert r.status_code == 201, r.content


@pytest.mark.django_db
def test_a_sealed_bid_loses_at_close_when_its_node_switched_to_processes():
    user, node, _ = registered_node(RTX4090_DUMP, name="dock")
    lot = _lot(user, node)
    buyer = funded_buyer()
    sealed = auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=lot.pk,
                                       price=2_000_000)
    provider_services.heartbeat_record(node=node, runtime="process", gpus=[])
    auctions.close_auction(auction_id=lot.pk, now=timezone.now() + timedelta(minutes=6))
    sealed = SealedBid.objects.get(pk=sealed.pk)
    assert sealed.status == "lost"
    assert Hold.objects.get(pk=sealed.hold_id).status == "released"
    assert not Lease.objects.filter(sealed_bid=sealed).exists()
