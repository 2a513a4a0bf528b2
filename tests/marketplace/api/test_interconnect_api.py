"""NVLink over HTTP: the runner's inventory topology (stored, validated), `interconnect` on
bids and sealed bids, and the listings that show a node's interconnect (API and pages)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Order
from providers.models import Gpu
from providers.runner.gpu_links import topology_fields
from providers.runner.nvml import DumpGpus
from providers.services import node_create, provider_onboard
from tests.factories import (
    UserFactory,
    ask,
    bid_body,
    ensure_catalog,
    funded_buyer,
    registered_node,
)
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import assert_refused, client_for, runner_client, snapshot
from tests.support.nvlink_hosts import h100_host

pytestmark = pytest.mark.django_db
H100 = "h100-sxm-80gb"


def inventory_body(path, **change_first):
    """The runner's inventory of the recorded host at `path` (as Agent.announce builds it),
    with keys of the first GPU item replaced."""
    source = DumpGpus(path)
    inv = source.inventory()
    readings = {r["uuid"]: r for r in source.sample_health([g.uuid for g in inv.gpus])}
    links = topology_fields(inv.gpus, readings)
    gpus = [{**g.as_protocol(), **links[g.uuid]} for g in inv.gpus]
    gpus[0] = {k: v for k, v in {**gpus[0], **change_first}.items() if v is not None}
    return {"hostname": "h", "driver_version": inv.driver_version,
            "cuda_version": inv.cuda_version, "runner_version": "test", "source": inv.source,
            "gpus": gpus}


@pytest.fixture
def fresh_node():
    ensure_catalog()
    provider = provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    return node_create(provider=provider, name="n1")


def test_the_inventory_stores_peers_and_the_pcie_link(fresh_node, tmp_path):
    body = inventory_body(h100_host(tmp_path, "nvswitch"))
    r = runner_client(fresh_node.runner_token).post("/api/v1/runner/inventory/", body,
                                                    format="json")
    assert r.status_code == 200, r.content
    assert r.json()["warnings"] == []
    first = r.json()["node"]["gpus"][0]
    assert (first["nvlink_links_active"], len(first["nvlink_peers"])) == (18, 7)
    assert (first["pcie_generation"], first["pcie_width"]) == (5, 16)
    gpu = Gpu.objects.get(uuid=first["uuid"])
    assert gpu.nvlink_peers == body["gpus"][0]["nvlink"]["peers"]


def test_a_peer_of_no_gpu_of_the_node_is_ignored_with_a_warning(fresh_node, tmp_path):
    body = inventory_body(h100_host(tmp_path, "pairs"),
                          nvlink={"links_active": 2, "peers": ["0000:64:00.0",
                                                               "0000:ee:00.0"]})
    r = runner_client(fresh_node.runner_token).post("/api/v1/runner/inventory/", body,
                                                    format="json")
    assert r.status_code == 200, r.content
    assert r.json()["warnings"] == ["gpus[0].nvlink.peers[1]: 00000000:EE:00.0 is not another "
                                    "GPU of this node; ignored"]
    gpu = Gpu.objects.get(uuid=body["gpus"][0]["uuid"])
    assert gpu.nvlink_peers == ["00000000:64:00.0"]


@pytest.mark.parametrize(("change", "field"), [
    ({"nvlink": {"links_active": "18", "peers": []}}, "gpus[0].nvlink.links_active"),
    ({"nvlink": {"links_active": 18, "peers": "00000000:64:00.0"}}, "gpus[0].nvlink.peers"),
    ({"nvlink": {"links_active": 18, "peers": ["53:00"]}}, "gpus[0].nvlink.peers[0]"),
    ({"nvlink": {"links_active": 18, "peers": [], "speed": 26}}, "gpus[0].nvlink.speed"),
    ({"nvlink": [18]}, "gpus[0].nvlink"),
    ({"nvlink": {"links_active": -1, "peers": []}}, "gpus[0].nvlink.links_active"),
    ({"pcie_generation": 5.0}, "gpus[0].pcie_generation"),
    ({"pcie_width": 0}, "gpus[0].pcie_width"),
])
def test_bad_topology_is_a_400_naming_the_item_and_writes_nothing(fresh_node, tmp_path,
                                                                   change, field):
    body = inventory_body(h100_host(tmp_path, "nvswitch"), **change)
    r = runner_client(fresh_node.runner_token).post("/api/v1/runner/inventory/", body,
                                                    format="json")
    assert_refused(r, field)
    assert not Gpu.objects.filter(node=fresh_node.node).exists()


@pytest.mark.parametrize(("body", "words"), [
    (bid_body(gpus=1, interconnect="nvlink"), "gang of 2"),
    (bid_body(gpus=4, gang_size=1, interconnect="nvlink"), "gang of 2"),
    (bid_body(gpus=4, interconnect="nvswitch"), "not a valid choice"),
    (bid_body(gpus=4, interconnect=True), "not a valid choice"),
])
def test_an_nvlink_bid_on_a_gang_of_one_is_a_400_naming_interconnect(body, words):
    ensure_catalog()
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    assert_refused(client_for(buyer).post("/api/v1/orders/", body, format="json"),
                   "interconnect", contains=words)
    assert snapshot(buyer) == before


def test_an_ask_with_interconnect_is_refused():
    _user, node, _t = registered_node()
    r = client_for(_user).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "1.00", "gpus": 2, "interconnect": "nvlink",
        "available_until": (timezone.now() + timedelta(days=1)).isoformat()}, format="json")
    assert_refused(r, "interconnect", contains="for bids")


def test_bids_and_sealed_bids_take_interconnect_and_answer_it(tmp_path):
    owner, node, _t = registered_node(h100_host(tmp_path, "nvswitch", "d4"), "mesh")
    ask(owner, node, price=2_000_000, gpus=4)
    buyer = funded_buyer(1000)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=4, price="3.00",
                                                           interconnect="nvlink"), format="json")
    assert r.status_code == 201, r.content
    assert (r.json()["interconnect"], r.json()["status"], len(r.json()["leases"])) == (
        "nvlink", "filled", 1)
    assert Order.objects.get(pk=r.json()["id"]).interconnect == "nvlink"
    lot = auctions.open_auction(provider_id=owner.pk, node_id=node.pk, gpus=4,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "2.00", "interconnect": "nvlink"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["interconnect"] == "nvlink"


def test_listings_say_what_connects_the_gpus(tmp_path, client):
    mesh_owner, mesh, _t = registered_node(h100_host(tmp_path, "nvswitch", "e5"), "mesh")
    pairs_owner, pairs, _u = registered_node(h100_host(tmp_path, "pairs", "f6"), "pairs")
    flat_owner, flat, _v = registered_node(h100_host(tmp_path, "pcie", "a7"), "flat")
    ask(flat_owner, flat, price=1_000_000, gpus=8)
    ask(pairs_owner, pairs, price=1_500_000, gpus=4)
    ask(mesh_owner, mesh, price=2_000_000, gpus=8)
    offers = client_for().get(f"/api/v1/gpu-classes/{H100}/").json()["offers"]
    name = mesh.gpus.first().gpu_class.name
    assert [(o["price"], o["gpus"], o["node_gpus"], o["interconnect"], o["summary"])
            for o in offers] == [
        ("1.000000", 8, 8, "PCIe only", f"8 \u00d7 {name}, PCIe only"),
        ("1.500000", 4, 8, "NVLink pairs", f"8 \u00d7 {name}, NVLink pairs"),
        ("2.000000", 8, 8, "NVLink full mesh", f"8 \u00d7 {name}, NVLink full mesh")]
    html = client.get(reverse("market", args=[H100])).content.decode()
    assert f"8 \u00d7 {name}, NVLink full mesh" in html and "NVLink pairs" in html
    login(client, mesh_owner)
    html = client.get(reverse("node", args=[mesh.pk])).content.decode()
    assert f"Interconnect: <strong>8 \u00d7 {name}, NVLink full mesh</strong>" in html
    assert "18 links, 7 peer GPUs" in html


def test_the_market_page_bid_form_takes_interconnect(tmp_path, client):
    owner, mesh, _t = registered_node(h100_host(tmp_path, "nvswitch", "b8"), "mesh")
    ask(owner, mesh, price=2_000_000, gpus=8)
    buyer = funded_buyer(1000)
    login(client, buyer)
    form = {"gpus": "1", "hours": "1", "price": "3.00", "gang_size": "", "time_in_force": "GTC",
            "image": "gpumarket/busybox:local", "command": "", "interconnect": "nvlink"}
    r = client.post(reverse("market", args=[H100]), form)
    assert r.status_code == 400
    assert "gang of 2" in field_error(r.content.decode(), "interconnect")
    assert not Order.objects.filter(owner=buyer).exists()
    r = client.post(reverse("market", args=[H100]), {**form, "gpus": "4"})
    assert r.status_code == 302
    order = Order.objects.get(owner=buyer)
    assert (order.interconnect, order.status) == ("nvlink", "filled")


def test_the_auction_page_takes_interconnect_and_says_why_a_lot_cannot(tmp_path, client):
    owner, flat, _t = registered_node(h100_host(tmp_path, "pcie", "c9"), "flat")
    lot = auctions.open_auction(provider_id=owner.pk, node_id=flat.pk, gpus=4,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    buyer = funded_buyer(1000)
    login(client, buyer)
    before = snapshot(buyer)
    r = client.post(reverse("auction", args=[lot.pk]), {"price": "3.00",
                                                        "interconnect": "nvlink"})
    assert r.status_code == 400
    assert "NVLink-connected" in field_error(r.content.decode(), "interconnect")
    assert snapshot(buyer) == before
    assert client.post(reverse("auction", args=[lot.pk]), {"price": "3.00"}).status_code == 302
