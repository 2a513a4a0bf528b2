"""The runner protocol through the HTTP API: inventory, heartbeat, lease list, lease
events from pending to a settled completion (85 % to the provider)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.models import Lease
from providers import services as provider_services
from providers.models import Gpu
from providers.runner.nvsmi import parse_dump
from settlement import services as ledger
from settlement.checks import first_violation
from tests.factories import H100_DUMP, UserFactory, funded_buyer, in_a_day
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db


def _inventory_body(dump=H100_DUMP, **changes):
    inv = parse_dump(dump)
    body = {"hostname": "gpu-host-1", "driver_version": inv.driver_version,
            "cuda_version": inv.cuda_version, "runner_version": "test",
            "source": f"simulate:{dump.name}", "gpus": [g.as_protocol() for g in inv.gpus]}
    body.update(changes)
    return body


def _fresh_node(name="node-1", user=None):
    """A provider with a node that has no GPUs yet; (user, node, runner token)."""
    user = user or UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Acme")
    created = provider_services.node_create(provider=provider, name=name)
    return user, created.node, created.runner_token


def _registered(name="node-1"):
    user, node, token = _fresh_node(name)
    r = runner_client(token).post("/api/v1/runner/inventory/", _inventory_body(),
                                  format="json")
    assert r.status_code == 200, r.content
    beat = runner_client(token).post("/api/v1/runner/heartbeat/", {"runtime": "docker"},
                                     format="json")  # `run` started: asks may name the node
    assert beat.status_code == 200, beat.content
    return user, node, token, r.json()


def test_inventory_registers_the_eight_h100s():
    _, node, _, body = _registered()
    gpus = body["node"]["gpus"]
    assert len(gpus) == 8 and Gpu.objects.filter(node=node).count() == 8
    assert {g["gpu_class"] for g in gpus} == {"h100-sxm-80gb"}
    assert len({g["uuid"] for g in gpus}) == 8
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    assert body["node"]["hostname"] == "gpu-host-1"
    assert body["node"]["driver_version"] == parse_dump(H100_DUMP).driver_version
    assert body["node"]["registered_at"]


def test_inventory_is_idempotent_for_the_same_node():
    _, node, token, _ = _registered()
    r = runner_client(token).post("/api/v1/runner/inventory/", _inventory_body(),
                                  format="json")
    assert r.status_code == 200
    assert Gpu.objects.filter(node=node).count() == 8


def test_inventory_unknown_gpu_class_names_the_item():
    _, node, token = _fresh_node()
    body = _inventory_body()
    body["gpus"][0]["gpu_class"] = "b300-imaginary"
    r = runner_client(token).post("/api/v1/runner/inventory/", body, format="json")
    err = assert_refused(r, "gpus[0].gpu_class", contains="unknown GPU class 'b300-imaginary'")
    assert err["detail"] == "gpus[0].gpu_class: unknown GPU class 'b300-imaginary'"
    assert Gpu.objects.count() == 0
    node.refresh_from_db()
    assert node.registered_at is None



def test_inventory_bad_items_are_refused_naming_field_and_index():
    _, _, token = _fresh_node()
    body = _inventory_body()
    body["gpus"][2]["uuid"] = "not-a-uuid"
    body["gpus"][5]["memory_mib"] = "lots"
    r = runner_client(token).post("/api/v1/runner/inventory/", body, format="json")
    assert r.status_code == 400
    errors = r.json()["errors"]
    # what the API says today: the item's index, dot-joined
    assert set(errors) == {"gpus.2.uuid", "gpus.5.memory_mib"} or set(errors) == {
        "gpus[2].uuid", "gpus[5].memory_mib"}
    assert Gpu.objects.count() == 0


def test_inventory_item_errors_use_the_same_path_as_the_services():
    _, _, token = _fresh_node()
    body = _inventory_body()
    body["gpus"][2]["uuid"] = "not-a-uuid"
    r = runner_client(token).post("/api/v1/runner/inventory/", body, format="json")
    assert_refused(r, "gpus[2].uuid")


def test_first_item_error_names_its_index():
    _, _, token = _fresh_node()
    body = _inventory_body()
    body["gpus"][0]["memory_mib"] = 0
    r = runner_client(token).post("/api/v1/runner/inventory/", body, format="json")
    assert r.status_code == 400
    assert set(r.json()["errors"]) & {"gpus[0].memory_mib", "gpus.0.memory_mib"}, r.json()


def test_inventory_empty_and_duplicate_lists_are_refused():
    _, _, token = _fresh_node()
    client = runner_client(token)
    assert_refused(client.post("/api/v1/runner/inventory/", _inventory_body(gpus=[]),
                               format="json"), "gpus")
    body = _inventory_body()
    body["gpus"][1]["uuid"] = body["gpus"][0]["uuid"]
    assert_refused(client.post("/api/v1/runner/inventory/", body, format="json"),
                   "gpus[1].uuid", contains="twice")
    assert Gpu.objects.count() == 0


def test_inventory_uuid_on_another_node_is_a_conflict():
    _, node_a, _, _ = _registered("a")
    _, node_b, token_b = _fresh_node("b")
    r = runner_client(token_b).post("/api/v1/runner/inventory/", _inventory_body(),
                                    format="json")
    assert_refused(r, "gpus", status=409, contains="registered to another node")
    assert Gpu.objects.filter(node=node_a).count() == 8
    assert Gpu.objects.filter(node=node_b).count() == 0


def test_heartbeat_accepts_floats_and_nulls():
    _, node, token, body = _registered()
    uuid = body["node"]["gpus"][0]["uuid"]
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "runtime": "docker",
        "gpus": [{"uuid": uuid, "temperature_c": 34, "power_w": 71.97, "utilization_pct": 0,
                  "ecc_uncorrectable": None},
                 {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "power_w": None}],
    }, format="json")
    assert r.status_code == 200, r.content
    assert "server_time" in r.json()
    health = Gpu.objects.get(uuid=uuid).last_health
    assert health["power_w"] == 71.97 and health["ecc_uncorrectable"] is None
    assert health["temperature_c"] == 34 and health["at"]
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None and node.runtime == "docker"
    # a reading of the wrong type is a 400 that changes nothing
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "gpus": [{"uuid": uuid}, {"uuid": uuid, "power_w": "hot"}]}, format="json")
    assert r.status_code == 400
    assert set(r.json()["errors"]) <= {"gpus.1.power_w", "gpus[1].power_w"}, r.json()
    assert Gpu.objects.get(uuid=uuid).last_health["power_w"] == 71.97


def test_heartbeat_bad_reading_of_the_first_gpu_names_it():
    _, _, token, body = _registered()
    uuid = body["node"]["gpus"][0]["uuid"]
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "gpus": [{"uuid": uuid, "power_w": "hot"}]}, format="json")
    assert r.status_code == 400
    assert set(r.json()["errors"]) & {"gpus[0].power_w", "gpus.0.power_w"}, r.json()


@pytest.mark.parametrize(("reading", "field"), [
    ({"temperature_c": 2**63}, "temperature_c"), ({"temperature_c": -101}, "temperature_c"),
    ({"utilization_pct": 101}, "utilization_pct"), ({"power_w": 1e23}, "power_w"),
    ({"power_w": -1}, "power_w"), ({"ecc_uncorrectable": -1}, "ecc_uncorrectable")])
def test_heartbeat_reading_out_of_any_gpu_s_range_is_refused_and_nothing_stored(reading,
                                                                               field):
    _, node, token, body = _registered()
    uuid = body["node"]["gpus"][0]["uuid"]
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "runtime": "docker", "gpus": [{"uuid": uuid, **reading}]}, format="json")
    assert r.status_code == 400, r.content
    assert set(r.json()["errors"]) & {f"gpus[0].{field}", f"gpus.0.{field}"}, r.json()
    node.refresh_from_db()
    assert node.last_heartbeat_at is None or node.runtime == "docker"
    assert field not in (Gpu.objects.get(uuid=uuid).last_health or {})


def test_heartbeat_with_an_unknown_runtime_is_refused_naming_it():
    _, node, token, _ = _registered()
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {"runtime": "kvm"},
                                  format="json")
    assert_refused(r, "runtime")
    node.refresh_from_db()
    assert node.runtime != "kvm"


def test_lease_lifecycle_through_the_runner_api():
    provider, node, token, _ = _registered()
    buyer = funded_buyer(100)
    runner = runner_client(token)
    assert runner.get("/api/v1/runner/leases/").json() == {"leases": []}

    # a standing ask at 2.00 and a crossing bid at 2.50: one lease at the ask's price
    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 4,
        "available_until": in_a_day().isoformat()}, format="json")
    assert r.status_code == 201, r.content
    r = client_for(buyer).post("/api/v1/orders/", {
        "side": "bid", "gpu_class": "h100-sxm-80gb", "price": "2.50", "gpus": 2,
        "hours": 1, "image": "gpumarket/busybox:local", "command": ["nvidia-smi"]},
        format="json")
    assert r.status_code == 201, r.content
    (lease_id,) = r.json()["leases"]

    leases = runner.get("/api/v1/runner/leases/").json()["leases"]
    assert len(leases) == 1
    pending = leases[0]
    assert pending["id"] == lease_id and pending["status"] == "pending"
    assert len(pending["gpu_uuids"]) == 2
    assert set(pending["gpu_uuids"]) <= set(Gpu.objects.filter(node=node)
                                             .values_list("uuid", flat=True))
    assert pending["image"] == "gpumarket/busybox:local"
    assert pending["command"] == ["nvidia-smi"]
    assert pending["env"] == {"GPUMARKET_LEASE_ID": str(lease_id)}
    assert pending["duration_seconds"] == 3600 and pending["ends_at"] is None

    url = f"/api/v1/runner/leases/{lease_id}/events/"
    r = runner.post(url, {"status": "starting"}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "starting"
    # running needs the container id
    assert_refused(runner.post(url, {"status": "running"}, format="json"), "container_id")
    assert_refused(runner.post(url, {"status": "paused"}, format="json"), "status")
    r = runner.post(url, {"status": "running", "container_id": "c0ffee" * 4}, format="json")
    assert r.status_code == 200, r.content
    running = r.json()
    assert running["status"] == "running" and running["started_at"] and running["ends_at"]
    lease = Lease.objects.get(pk=lease_id)
    assert lease.ends_at - lease.started_at == timedelta(hours=1)
    # a repeated report changes nothing
    r = runner.post(url, {"status": "running", "container_id": "c0ffee" * 4}, format="json")
    assert r.status_code == 200 and r.json()["started_at"] == running["started_at"]

    # the lease ran its full hour (moved back in the database: no sleeping in tests)
    Lease.objects.filter(pk=lease_id).update(
        started_at=timezone.now() - timedelta(hours=1, seconds=5),
        ends_at=timezone.now() - timedelta(seconds=5))
    r = runner.post(url, {"status": "completed", "usage_seconds": 3600}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "completed"

    cost = 2_000_000 * 2  # 2.00 USD × 2 GPUs × 1 h, at the resting ask's price
    fee = cost * 1500 // 10000
    assert ledger.wallet(user_id=provider.pk).earned == cost - fee == 3_400_000
    wallet = client_for(provider).get("/api/v1/wallet/").json()
    assert wallet["earned"] == "3.400000"
    assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(
        available=100_000_000 - cost, held=0, earned=0)

    shown = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    assert shown["status"] == "completed"
    assert (shown["cost"], shown["provider_amount"], shown["platform_fee"]) == (
        "4.000000", "3.400000", "0.600000")
    assert [e["to_status"] for e in shown["events"]] == [
        "pending", "starting", "running", "completed"]
    assert runner.get("/api/v1/runner/leases/").json() == {"leases": []}
    assert first_violation() is None

    # a second completion, or any later report, is a conflict and changes nothing
    before = snapshot(buyer, provider)
    for status in ("completed", "failed", "starting"):
        r = runner.post(url, {"status": status, "container_id": "x"}, format="json")
        assert r.status_code == 409, (status, r.content)
        assert r.json()["detail"]
    assert snapshot(buyer, provider) == before


def test_failed_before_running_charges_nothing():
    provider, node, token, _ = _registered()
    buyer = funded_buyer(100)
    client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 8,
        "available_until": in_a_day().isoformat()}, format="json")
    r = client_for(buyer).post("/api/v1/orders/", {
        "side": "bid", "gpu_class": "h100-sxm-80gb", "price": "2.00", "gpus": 8, "hours": 2},
        format="json")
    (lease_id,) = r.json()["leases"]
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease_id}/events/",
                                  {"status": "failed", "cause": "image pull failed"},
                                  format="json")
    assert r.status_code == 200, r.content
    lease = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    assert lease["status"] == "failed" and lease["cost"] == "0.000000"
    assert lease["cause"] == "image pull failed"
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000
    assert ledger.wallet(user_id=provider.pk).earned == 0
