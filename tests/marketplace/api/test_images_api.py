"""The marketplace's side of images (docs/IMAGES.md) through the HTTP API: the heartbeat's
`images` report (stored only when it changes; a bad one refused whole), a starting lease's
pull progress (starting → starting events, `progress`, never billed), the runner's wanted
images, bids that prefer nodes holding their image (only among asks at the same best
price) and the offers' "image cached on N of M nodes"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace.api.runner_images import wanted_images
from marketplace.leases import mark_running
from marketplace.models import Lease
from providers.models import Node, NodeImage
from settlement.checks import first_violation
from settlement.models import Account, Hold
from tests.factories import H100, ask, bid_body, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client

pytestmark = pytest.mark.django_db

IMAGE = "registry.example:5000/team/train:1"


def beat(token, **body):
    return runner_client(token).post("/api/v1/runner/heartbeat/",
                                     {"runtime": "docker", **body}, format="json")


def test_the_heartbeat_report_is_stored_when_it_changes_and_a_bad_one_changes_nothing():
    _, node, token = registered_node(name="img-1")
    r = beat(token, images=[{"image": IMAGE, "bytes": 5 << 30},
                            {"image": "docker.io/library/busybox", "bytes": 2_000_000}])
    assert r.status_code == 200, r.content
    assert dict(node.images.values_list("image", "bytes")) == {
        IMAGE: 5 << 30, "busybox:latest": 2_000_000}  # the runner's normal form
    with CaptureQueriesContext(connection) as same:
        assert beat(token, images=[{"image": IMAGE, "bytes": 5 << 30},
                                   {"image": "busybox:latest", "bytes": 2_000_000}]
                    ).status_code == 200
    assert not [q for q in same.captured_queries if "providers_nodeimage" in q["sql"]
                and not q["sql"].startswith("SELECT")]  # unchanged: no write
    assert beat(token, images=[{"image": IMAGE, "bytes": 5 << 30}]).status_code == 200
    assert list(node.images.values_list("image", flat=True)) == [IMAGE]
    before = node.last_heartbeat_at
    node.refresh_from_db()
    last = node.last_heartbeat_at
    for bad, field in (([{"image": "Not An Image!", "bytes": 1}], "images[0].image"),
                       ([{"image": IMAGE, "bytes": -1}], "images[0].bytes"),
                       ([{"image": IMAGE, "bytes": True}], "images[0].bytes"),
                       ([{"image": IMAGE, "bytes": 2**63}], "images[0].bytes"),  # > bigint
                       ({"image": IMAGE}, "images")):
        assert_refused(beat(token, images=bad), field)
    node.refresh_from_db()
    assert node.last_heartbeat_at == last and last >= before  # nothing applied
    assert list(node.images.values_list("image", flat=True)) == [IMAGE]
    assert beat(token).status_code == 200  # no report: the rows stay
    assert node.images.count() == 1
    shown = client_for(node.provider.user).get(f"/api/v1/nodes/{node.pk}/").json()["images"]
    assert [(i["image"], i["bytes"]) for i in shown] == [(IMAGE, 5 << 30)]  # the provider sees it


def test_pull_progress_is_shown_while_starting_and_the_clock_starts_at_running():
    provider, node, token = registered_node(name="img-2")
    ask(provider, node, price=2_400_000, gpus=2)
    buyer = funded_buyer(100)
    buyer_api = client_for(buyer)
    r = buyer_api.post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=IMAGE,
                                                   command=["sleep", "60"]), format="json")
    assert r.status_code == 201, r.content
    [lease_id] = r.json()["leases"]
    events = f"/api/v1/runner/leases/{lease_id}/events/"
    runner = runner_client(token)
    for cause in ("", f"pulling image {IMAGE}: 312 MiB of 1024 MiB (30 %), 1 of 3 layers",
                  f"pulling image {IMAGE}: 312 MiB of 1024 MiB (30 %), 1 of 3 layers",
                  f"image {IMAGE} pulled in 12.4 s"):
        r = runner.post(events, {"status": "starting", "cause": cause}, format="json")
        assert r.status_code == 200 and r.json()["status"] == "starting", r.content
    seen = buyer_api.get(f"/api/v1/leases/{lease_id}/").json()
    assert seen["status"] == "starting" and seen["progress"] == f"image {IMAGE} pulled in 12.4 s"
    assert seen["started_at"] is None and seen["ends_at"] is None  # no clock yet
    notes = [e["cause"] for e in seen["events"]
             if e["from_status"] == e["to_status"] == "starting"]
    assert notes == [f"pulling image {IMAGE}: 312 MiB of 1024 MiB (30 %), 1 of 3 layers",
                     f"image {IMAGE} pulled in 12.4 s"]  # the repeated one recorded once
    r = runner.post(events, {"status": "running", "container_id": "c" * 64}, format="json")
    assert r.status_code == 200
    lease = Lease.objects.get(pk=lease_id)
    last_note = lease.events.filter(to_status="starting").order_by("-at").first()
    assert lease.started_at >= last_note.at  # every second of the pull was before it
    assert lease.ends_at == lease.started_at + timedelta(seconds=3600)
    r = runner.post(events, {"status": "starting", "cause": "late"}, format="json")
    assert r.status_code == 409  # a running lease takes no progress


def test_a_failed_pull_ends_the_lease_unbilled():
    provider, node, token = registered_node(name="img-3")
    ask(provider, node, price=2_400_000, gpus=2)
    buyer = funded_buyer(100)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=IMAGE,
                                                           command=["true"]), format="json")
    [lease_id] = r.json()["leases"]
    runner = runner_client(token)
    url = f"/api/v1/runner/leases/{lease_id}/events/"
    runner.post(url, {"status": "starting"}, format="json")
    cause = f"image {IMAGE} could not be pulled: manifest unknown"
    r = runner.post(url, {"status": "failed", "cause": cause}, format="json")
    assert r.status_code == 200, r.content
    lease = Lease.objects.get(pk=lease_id)
    assert (lease.status, lease.cause, lease.cost) == ("failed", cause, 0)
    assert (lease.fault, lease.failure_code) == ("buyer", "image_invalid")
    assert first_violation() is None


def test_a_pull_from_an_unreachable_registry_is_not_the_provider_s_fault(settings):
    """The new-user trial's chain: connection refused failed over node to node forever."""
    settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY = True  # the trial's registry address
    provider, node, token = registered_node(name="img-5", own_uuids=True)
    ask(provider, node, price=2_400_000, gpus=2)
    other, node_b, _ = registered_node(name="img-6", own_uuids=True)
    ask(other, node_b, price=2_400_000, gpus=2)  # failover would have a place to go
    buyer = funded_buyer(100)
    ghost = "127.0.0.1:27998/ghost/img:1"
    r = client_for(buyer).post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=ghost,
                                                           command=["true"]), format="json")
    [lease_id] = r.json()["leases"]
    runner = runner_client(token)
    url = f"/api/v1/runner/leases/{lease_id}/events/"
    runner.post(url, {"status": "starting"}, format="json")
    cause = (f"image {ghost} could not be pulled: Get \"http://127.0.0.1:27998/v2/\": dial "
             "tcp 127.0.0.1:27998: connect: connection refused")
    assert runner.post(url, {"status": "failed", "cause": cause},
                       format="json").status_code == 200
    lease = Lease.objects.get(pk=lease_id)
    assert (lease.status, lease.cause, lease.cost, lease.fault_credit) == ("failed", cause, 0, 0)
    assert (lease.fault, lease.failure_code) == ("buyer", "image_unavailable")
    assert (lease.failover_state, lease.carry_hold_id) == ("", None)
    assert not Lease.objects.filter(continues_id=lease_id).exists()
    hold = Hold.objects.get(pk=lease.hold_id)
    assert hold.status != "active" and hold.captured == 0  # settled at 0, the rest released
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance == 0
    n = Node.objects.get(pk=lease.node_id)
    assert n.reliability is None  # no record: a failed pull is no provider failure
    body = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    assert body["cause"] == cause and body["failure_code"] == "image_unavailable"
    assert first_violation() is None


def _two_nodes_same_price():
    """Two nodes asking the same price; the later ask's node holds IMAGE."""
    p1, n1, _t1 = registered_node(name="older", own_uuids=True)
    p2, n2, t2 = registered_node(name="holder", own_uuids=True)
    ask(p1, n1, price=2_400_000, gpus=2)
    ask(p2, n2, price=2_400_000, gpus=2)
    assert beat(t2, images=[{"image": IMAGE, "bytes": 1 << 30}]).status_code == 200
    return (p1, n1), (p2, n2)


def test_a_bid_preferring_its_image_takes_the_holder_at_the_same_price_only():
    (_p1, n1), (_p2, n2) = _two_nodes_same_price()
    buyer = funded_buyer(1000)
    api = client_for(buyer)
    plain = api.post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=IMAGE,
                                                 command=["true"]), format="json").json()
    assert Lease.objects.get(pk=plain["leases"][0]).node_id == n1.pk  # time priority
    r = api.post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=IMAGE,
                                             command=["true"], prefer_cached_image=True),
                 format="json")
    assert r.status_code == 201 and r.json()["prefer_cached_image"] is True, r.content
    assert Lease.objects.get(pk=r.json()["leases"][0]).node_id == n2.pk  # the holder
    # a cheaper ask on a node without the image wins: never a worse price for a preference
    p3, n3, _ = registered_node(name="cheap", own_uuids=True)
    ask(p3, n3, price=2_300_000, gpus=1)
    r = api.post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=IMAGE,
                                             command=["true"], prefer_cached_image=True),
                 format="json").json()
    lease = Lease.objects.get(pk=r["leases"][0])
    assert (lease.node_id, lease.price) == (n3.pk, 2_300_000)
    assert first_violation() is None


def test_a_preference_without_an_image_is_refused_and_asks_cannot_prefer():
    _two_nodes_same_price()
    buyer = funded_buyer(10)
    api = client_for(buyer)
    assert_refused(api.post("/api/v1/orders/", bid_body(prefer_cached_image=True,
                                                        command=["true"]), format="json"),
                   "prefer_cached_image", contains="needs an image")
    assert_refused(api.post("/api/v1/orders/", bid_body(image=IMAGE,
                                                        prefer_cached_image="yes"),
                            format="json"), "prefer_cached_image")


def test_offers_say_on_how_many_nodes_the_image_is_cached():
    (_p1, n1), (_p2, n2) = _two_nodes_same_price()
    r = client_for().get(f"/api/v1/gpu-classes/{H100}/offers/", {"image": IMAGE})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["image_note"] == "image cached on 1 of 2 nodes"
    assert {row["node"]["id"]: row["image_cached"] for row in body["results"]} == {
        n1.pk: False, n2.pk: True}
    assert "image_note" not in client_for().get(f"/api/v1/gpu-classes/{H100}/offers/").json()
    assert_refused(client_for().get(f"/api/v1/gpu-classes/{H100}/offers/",
                                    {"image": "Bad Image"}), "image")


def test_the_runner_is_told_the_images_of_recent_leases_then_the_templates():
    provider, node, token = registered_node(name="img-4")
    ask(provider, node, price=2_400_000, gpus=4)
    buyer = funded_buyer(100)
    ghost = "127.0.0.1:27998/ghost/img:1"
    for image in (IMAGE, IMAGE, ghost, ghost, ghost):
        client_for(buyer).post("/api/v1/orders/", bid_body(price="2.40", gpus=1, image=image,
                                                           command=["true"]), format="json")
    for lease in Lease.objects.filter(image=IMAGE):  # the ghost's never reached running
        mark_running(lease=lease, container_id="c" * 64)
    r = runner_client(token).get("/api/v1/runner/images/")
    assert r.status_code == 200, r.content
    items = r.json()["images"]
    assert items[0] == {"image": IMAGE, "why": "recent leases", "leases": 2}
    assert any(i["why"] == "template" for i in items[1:])
    assert ghost not in {i["image"] for i in items}  # failed or pending leases: not counted
    assert len({i["image"] for i in items}) == len(items) == len(wanted_images(node))
    assert NodeImage.objects.count() == 0


def test_a_private_registry_image_of_an_old_lease_is_not_wanted(settings):
    provider, node, token = registered_node(name="img-5")
    ask(provider, node, price=2_400_000, gpus=4)
    settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY = True  # as a lease from before the rule
    r = client_for(funded_buyer(100)).post("/api/v1/orders/", bid_body(
        price="2.40", gpus=1, image="10.0.0.5:5000/x:1", command=["true"]), format="json")
    assert r.status_code == 201
    Lease.objects.filter(image="10.0.0.5:5000/x:1").update(  # it ran: wanted when allowed
        status="running", started_at=timezone.now())
    assert wanted_images(node)[0]["image"] == "10.0.0.5:5000/x:1"
    settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY = False
    items = runner_client(token).get("/api/v1/runner/images/").json()["images"]
    assert items and all(i["why"] == "template" for i in items), items
