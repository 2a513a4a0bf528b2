"""Environment templates in the API: GET /api/v1/templates/; a bid or sealed bid naming a
template gets its image, command, ports with roles, env, min_cuda and ssh, what it gives
overriding them; the lease and the runner's payload carry them; a resting bid no node can
run says why (`match_note`); bad template input is a 400 naming the field with nothing
written and no hold left."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Lease, Order, SealedBid
from settlement import services as ledger
from tests.factories import MISSING, ask, ask_body, bid_body, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db
LOCAL_IMAGE = "gpumarket/busybox:local"


def _post_bid(buyer, **changes):
    return client_for(buyer).post("/api/v1/orders/", bid_body(**{"gpus": 1, **changes}),
                                  format="json")


def test_the_catalog_lists_the_four_templates_with_real_images_and_their_cuda_source():
    r = client_for().get("/api/v1/templates/")
    assert r.status_code == 200
    by_id = {t["id"]: t for t in r.json()["results"]}
    assert set(by_id) >= {"cuda-ssh", "pytorch-jupyter", "vllm", "custom"}
    assert by_id["cuda-ssh"]["image"] == "nvidia/cuda:12.4.1-base-ubuntu22.04"
    assert by_id["cuda-ssh"]["ports"] == [{"port": 22, "role": "ssh"}]
    assert by_id["cuda-ssh"]["needs_shell_user"] is True
    assert by_id["pytorch-jupyter"]["image"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert {"port": 8888, "role": "jupyter"} in by_id["pytorch-jupyter"]["ports"]
    assert by_id["vllm"]["ports"] == [{"port": 8000, "role": "http"}]
    assert by_id["vllm"]["image"] == "vllm/vllm-openai:v0.6.4"
    assert by_id["custom"]["image"] == "" and by_id["custom"]["min_cuda"] == ""
    for t in by_id.values():
        assert set(t) >= {"id", "title", "image", "command", "ports", "env", "min_cuda",
                          "needs_shell_user", "cuda_source"}
        assert t["cuda_source"]
    assert all(t["min_cuda"] == "12.4" for k, t in by_id.items() if k != "custom")


def test_a_template_bid_fills_its_terms_through_to_the_lease_and_the_runner():
    provider, node, token = registered_node(cuda_version="12.6")
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100, ssh_key=True)
    r = _post_bid(buyer, template="pytorch-jupyter", image=LOCAL_IMAGE,
                  env={"WANDB_MODE": "offline"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["template"] == "pytorch-jupyter" and body["image"] == LOCAL_IMAGE
    assert body["ports"] == [22, 8888]
    assert body["port_roles"] == {"22": "ssh", "8888": "jupyter"}
    assert body["ssh"] is True and body["min_cuda"] == "12.4"
    assert body["env"] == {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    assert body["command"][0] == "/bin/sh" and body["match_note"] is None
    (lease_id,) = body["leases"]
    lease = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    for name in ("template", "min_cuda", "port_roles", "ssh", "env", "image", "ports"):
        assert lease[name] == body[name], name
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["port_roles"] == {"22": "ssh", "8888": "jupyter"}
    assert listed["env"] == {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline",
                             "GPUMARKET_LEASE_ID": str(lease_id)}
    assert listed["image"] == LOCAL_IMAGE and listed["ports"] == [22, 8888]


def test_a_template_alone_gives_its_own_image_and_a_raw_image_may_ask_for_ssh():
    provider, node, _ = registered_node(cuda_version="12.4")
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100, ssh_key=True)
    r = _post_bid(buyer, template="vllm")
    assert r.status_code == 201, r.content
    assert r.json()["image"] == "vllm/vllm-openai:v0.6.4" and r.json()["ssh"] is False
    assert r.json()["port_roles"] == {"8000": "http"} and "--model" in r.json()["command"]
    r = _post_bid(buyer, image=LOCAL_IMAGE, ssh=True, ports=[8080])
    assert r.status_code == 201, r.content
    assert r.json()["template"] == "" and r.json()["ports"] == [22, 8080]
    assert r.json()["port_roles"] == {"22": "ssh"} and r.json()["min_cuda"] == ""
    # a template's ssh may be turned off (its ports stay), or on where it has no ssh port
    r = _post_bid(buyer, template="cuda-ssh", ssh=False)
    assert r.status_code == 201 and r.json()["ssh"] is False and r.json()["ports"] == [22]
    r = _post_bid(buyer, template="vllm", ssh=True)
    assert r.status_code == 201 and r.json()["ports"] == [22, 8000]
    assert r.json()["port_roles"] == {"22": "ssh", "8000": "http"}


def test_own_image_with_a_template_may_list_fewer_ports_and_keeps_their_roles():
    """Only the template's own image needs its ports: an own image lists its own."""
    provider, node, _ = registered_node(cuda_version="12.4")
    ask(provider, node, price=2_000_000)
    r = _post_bid(funded_buyer(100, ssh_key=True), template="pytorch-jupyter",
                  image="gpumarket/sshd:local", ports=[22])
    assert r.status_code == 201, r.content
    assert r.json()["ports"] == [22] and r.json()["port_roles"] == {"22": "ssh"}
    assert r.json()["ssh"] is True and r.json()["image"] == "gpumarket/sshd:local"


def test_a_bid_no_node_can_run_rests_and_its_answer_and_get_say_why():
    provider, node, _ = registered_node()  # the dump's driver 535: CUDA 12.2
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100, ssh_key=True)
    r = _post_bid(buyer, template="cuda-ssh")
    assert r.status_code == 201, r.content
    note = "needs CUDA 12.4: 0 of 1 nodes with asks qualify"
    assert r.json()["leases"] == [] and r.json()["status"] == "open"
    assert r.json()["match_note"] == note
    got = client_for(buyer).get(f"/api/v1/orders/{r.json()['id']}/").json()
    assert got["match_note"] == note
    # the same with min_cuda at the node's own level and our own image fills
    r = _post_bid(buyer, template="cuda-ssh", image=LOCAL_IMAGE, min_cuda="12.2")
    assert r.status_code == 201 and len(r.json()["leases"]) == 1
    assert r.json()["match_note"] is None
    assert Lease.objects.get().min_cuda == "12.2"


@pytest.mark.parametrize(("changes", "field", "says"), [
    ({"template": "pytorch"}, "template", "known templates are cuda-ssh, custom, "
                                          "pytorch-jupyter, vllm"),
    ({"template": 7}, "template", "must be a string"),
    ({"min_cuda": "12"}, "min_cuda", "MAJOR.MINOR"),
    ({"min_cuda": "v12.4"}, "min_cuda", "MAJOR.MINOR"),
    ({"min_cuda": "0.0"}, "min_cuda", "MAJOR.MINOR"),
    ({"min_cuda": 12.4}, "min_cuda", "must be a string"),
    ({"template": "pytorch-jupyter", "ports": [8888]}, "ports", "22 (ssh)"),
    ({"template": "pytorch-jupyter", "ports": [22],
      "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}, "ports", "8888 (jupyter)"),
    ({"template": "cuda-ssh", "min_cuda": "11.8"}, "min_cuda", "needs CUDA 12.4"),
    ({"template": "custom"}, "image", "give one"),
    ({"env": {"lower_case": "1"}}, "env", "capital letters"),
    ({"env": {"GPUMARKET_LEASE_ID": "7"}}, "env.GPUMARKET_LEASE_ID", "runner"),
    ({"env": {"A": "x\u0000y"}}, "env.A", "NUL"),
    ({"env": ["A=1"]}, "env", None),
    ({"ssh": "yes"}, "ssh", "true or false"),
])
def test_bad_template_input_is_refused_naming_the_field_and_writes_nothing(changes, field,
                                                                            says):
    provider, node, _ = registered_node(cuda_version="12.6")
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    r = _post_bid(buyer, **changes)
    assert_refused(r, field, contains=says)
    assert snapshot(buyer) == before


def test_an_ask_refuses_the_template_fields():
    provider, node, _ = registered_node()
    for name, value in (("template", "vllm"), ("min_cuda", "12.4"), ("ssh", True),
                        ("env", {"A": "1"})):
        r = client_for(provider).post("/api/v1/orders/", ask_body(node, **{name: value}),
                                      format="json")
        assert_refused(r, name, contains="for bids")
    assert not Order.objects.exists()


def _auction(cuda: str):
    provider, node, _ = registered_node(cuda_version=cuda)
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                 reserve_price=1_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


def test_a_sealed_bid_takes_a_template_and_its_lease_carries_it():
    auction = _auction("12.6")
    buyer = funded_buyer(100, ssh_key=True)
    r = client_for(buyer).post(f"/api/v1/auctions/{auction.pk}/bids/",
                               {"price": "1.50", "template": "pytorch-jupyter",
                                "image": LOCAL_IMAGE}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["template"] == "pytorch-jupyter" and r.json()["ports"] == [22, 8888]
    assert r.json()["min_cuda"] == "12.4" and r.json()["ssh"] is True
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    lease = Lease.objects.get()
    assert lease.template == "pytorch-jupyter" and lease.image == LOCAL_IMAGE
    assert lease.port_roles == {"22": "ssh", "8888": "jupyter"} and lease.min_cuda == "12.4"
    assert lease.env == {"PYTHONUNBUFFERED": "1"} and lease.ssh is True


def test_a_sealed_bid_on_a_node_below_its_cuda_is_a_409_naming_it_with_nothing_held():
    auction = _auction("12.2")
    buyer = funded_buyer(100, ssh_key=True)
    before = snapshot(buyer)
    r = client_for(buyer).post(f"/api/v1/auctions/{auction.pk}/bids/",
                               {"price": "1.50", "template": "cuda-ssh"}, format="json")
    body = assert_refused(r, "min_cuda", status=409, contains="CUDA 12.2")
    assert "12.4" in body["detail"]
    assert snapshot(buyer) == before
    r = client_for(buyer).post(f"/api/v1/auctions/{auction.pk}/bids/",
                               {"price": "1.50", "template": "nope"}, format="json")
    assert_refused(r, "template", contains="known templates")
    assert snapshot(buyer) == before and not SealedBid.objects.exists()


def test_a_sealed_bid_whose_node_falls_below_its_cuda_before_close_loses_and_is_released():
    auction = _auction("12.6")
    fits, needs = funded_buyer(100), funded_buyer(100)
    auctions.place_sealed_bid(bidder_id=fits.pk, auction_id=auction.pk, price=1_200_000)
    auctions.place_sealed_bid(bidder_id=needs.pk, auction_id=auction.pk, price=1_900_000,
                              min_cuda="12.4")
    auction.node.cuda_version = "12.2"  # the provider downgraded the driver
    auction.node.save(update_fields=["cuda_version"])
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    lease = Lease.objects.get()
    assert lease.buyer == fits and lease.price == 1_000_000  # reserve: no other bid counted
    lost = SealedBid.objects.get(bidder=needs)
    assert lost.status == "lost"
    assert ledger.wallet(user_id=needs.pk).held == 0


def test_missing_image_without_a_template_still_uses_the_default_image():
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000)
    r = _post_bid(funded_buyer(100), image=MISSING)
    assert r.status_code == 201 and r.json()["template"] == "" and r.json()["port_roles"] == {}


def test_listing_resting_template_bids_reads_the_nodes_once(django_assert_max_num_queries):
    provider, node, _ = registered_node()  # CUDA 12.2
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100, ssh_key=True)
    for _ in range(5):
        assert _post_bid(buyer, template="cuda-ssh").json()["status"] == "open"
    client = client_for(buyer)
    with django_assert_max_num_queries(6):
        body = client.get("/api/v1/orders/?side=bid").json()
    assert [o["match_note"] for o in body["results"]] == \
        ["needs CUDA 12.4: 0 of 1 nodes with asks qualify"] * 5
