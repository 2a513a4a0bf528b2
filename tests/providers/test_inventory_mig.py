"""MIG slices in the inventory (issue 13): a MIG-enabled GPU registers as its slices, one
unit each in its profile market; contradictory reports are refused naming the item with
nothing written; a new layout replaces the old units (asks shrink and grow) unless a
lease runs on one of them (409 naming the lease); a fatal finding on the parent takes
every slice out, one naming a slice only that slice."""

from __future__ import annotations

import copy
from dataclasses import replace
from decimal import Decimal

import pytest

from marketplace import book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import LeaseGpu
from providers import benchmarks
from providers.models import Gpu, GpuBenchmark
from providers.runner import mig as runner_mig
from providers.runner.nvsmi import MigDevice
from settlement.checks import first_violation
from tests.factories import H100, H100_MIG, funded_buyer, in_a_day, mig_node
from tests.support.api import assert_refused, runner_client
from tests.support.mig_host import A100_MIG

pytestmark = pytest.mark.django_db

PARENT = H100_MIG.gpus[0].uuid
ONE_G = f"{H100}.1g.10gb"


def _body(items: list[dict]) -> dict:
    return {"hostname": "mig-host", "driver_version": "590.48.01", "cuda_version": "13.1",
            "runner_version": "test", "source": "test", "gpus": items}


def _layout(*devices: MigDevice):
    gpu = replace(H100_MIG.gpus[0], mig_devices=tuple(devices))
    return replace(H100_MIG, gpus=[gpu])


def _post(token, inventory_or_items):
    items = (inventory_or_items if isinstance(inventory_or_items, list)
             else runner_mig.inventory_items(inventory_or_items))
    return runner_client(token).post("/api/v1/runner/inventory/", _body(items), format="json")


def test_a_mig_enabled_gpu_registers_as_its_slices_only():
    _user, node, token = mig_node()
    units = {g.uuid: g for g in node.gpus.all()}
    assert set(units) == {d.uuid for d in H100_MIG.gpus[0].mig_devices}
    one_g = units[H100_MIG.gpus[0].mig_devices[2].uuid]
    assert (one_g.gpu_class.slug, one_g.mig_profile, one_g.sm_count, one_g.gpu_instance_id,
            one_g.memory_mib, one_g.parent.uuid) == (ONE_G, "1g.10gb", 16, 9, 9984, PARENT)
    parent = Gpu.every.get(uuid=PARENT)
    assert not parent.listed and parent.slices.count() == 4
    # the parent is nowhere in the market: not in the node's classes, never leasable
    assert book.node_market(node, ONE_G).slug == ONE_G
    assert set(node.gpus.values_list("gpu_class__slug", flat=True)) == {
        f"{H100}.3g.40gb", f"{H100}.2g.20gb", ONE_G}

    answer = _post(token, H100_MIG)  # the same report again: nothing changes
    assert answer.status_code == 200, answer.content
    slices = {g["uuid"]: g for g in answer.json()["node"]["gpus"]}
    assert slices[H100_MIG.gpus[0].mig_devices[2].uuid]["parent_uuid"] == PARENT
    assert PARENT not in slices


def test_the_recorded_a100_registers_its_four_1g_20gb_slices():
    _user, node, _token = mig_node(A100_MIG)
    assert sorted(node.gpus.values_list("gpu_class__slug", "memory_mib", "sm_count",
                                        "gpu_instance_id")) == [
        ("a100-sxm-80gb.1g.20gb", 19968, 14, gi) for gi in (3, 4, 5, 6)]
    assert book.node_market(node, None).slug == "a100-sxm-80gb.1g.20gb"


def _items() -> list[dict]:
    return copy.deepcopy(runner_mig.inventory_items(H100_MIG))


def _refusals():
    def whole_and_slices(items):
        items[0]["listed"] = True
        return "gpus[0].listed", "whole and as MIG slices"

    def parent_missing(items):
        del items[0]
        return "gpus[0].parent_uuid", "not a GPU of this report"

    def parent_not_mig(items):
        items[0]["mig_mode"] = "Disabled"
        return "gpus[1].parent_uuid", "not MIG-enabled"

    def unknown_profile(items):
        items[3].update(mig_profile="5g.50gb", gpu_class=f"{H100}.5g.50gb")
        return "gpus[3].gpu_class", "unknown GPU class"

    def profile_unknown_for_parent(items):
        items[3]["mig_profile"] = "1g.12gb"
        return "gpus[3].mig_profile", "unknown for h100-sxm-80gb"

    def class_of_another_profile(items):
        items[3]["gpu_class"] = f"{H100}.2g.20gb"
        return "gpus[3].gpu_class", "market of a 1g.10gb slice"

    def duplicate(items):
        items[4]["uuid"] = items[3]["uuid"]
        return "gpus[4].uuid", "listed twice (also gpus[3])"

    def beyond_parent(items):
        items[1]["memory_mib"] = 70_000
        return "gpus[2].memory_mib", "would hold 90096 MiB, more than its 81559 MiB"

    def slice_fields_on_a_gpu(items):
        items[0]["mig_profile"] = "1g.10gb"
        return "gpus[0].mig_profile", "MIG slice only"

    def other_bus(items):
        items[2]["pci_bus_id"] = "00000000:0A:00.0"
        return "gpus[2].pci_bus_id", "parent's"

    def same_instance_twice(items):  # two compute instances of GPU instance 2 as slices
        items[2]["gpu_instance_id"] = items[1]["gpu_instance_id"]
        return "gpus[2].gpu_instance_id", "GPU instance 2 of GPU"

    def all_zero_uuid(items):
        items[0]["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
        for item in items[1:]:
            item["parent_uuid"] = items[0]["uuid"]
        return "gpus[0].uuid", "all-zero UUID, which NVML never reports"

    return [same_instance_twice, all_zero_uuid, whole_and_slices, parent_missing,
            parent_not_mig, unknown_profile, profile_unknown_for_parent,
            class_of_another_profile, duplicate, beyond_parent, slice_fields_on_a_gpu, other_bus]


@pytest.mark.parametrize("spoil", _refusals(), ids=lambda f: f.__name__)
def test_a_contradictory_report_is_refused_naming_the_item(spoil):
    _user, node, token = mig_node()
    before = sorted(Gpu.every.filter(node=node).values_list("uuid", "listed", "memory_mib"))
    items = _items()
    field, words = spoil(items)
    assert_refused(_post(token, items), field, contains=words)
    after = sorted(Gpu.every.filter(node=node).values_list("uuid", "listed", "memory_mib"))
    assert after == before  # nothing written


def _heartbeat(token, findings):
    r = runner_client(token).post("/api/v1/runner/heartbeat/",
                                  {"runtime": "docker", "findings": findings}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def test_a_new_layout_replaces_the_units_and_the_asks_follow(
        django_capture_on_commit_callbacks):
    provider, node, token = mig_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=ONE_G,
                         price=400_000, gpus=2, available_until=in_a_day()).order
    buyer = funded_buyer(100)
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=ONE_G, price=400_000, gpus=1,
                            duration_seconds=600)
    [lease] = placed.leases
    [leased] = [lg.gpu for lg in lease.lease_gpus.all()]
    old = H100_MIG.gpus[0].mig_devices
    fresh = MigDevice("MIG-00000004-0000-0000-0000-000000000004", "1g.10gb", 11, 0, 9984, 16, 4)
    dropped = next(d for d in old if d.profile == "1g.10gb" and d.uuid != leased.uuid)
    keep = [d for d in old if d.uuid != dropped.uuid and d.profile != "2g.20gb"]

    # the leased slice leaving the layout: refused naming the lease, nothing changed
    without_leased = [d for d in old if d.uuid != leased.uuid]
    answer = _post(token, _layout(*without_leased, fresh))
    assert_refused(answer, "gpus", status=409, contains=f"lease {lease.pk} runs on")
    assert node.gpus.filter(uuid=fresh.uuid).count() == 0

    # the other 1g.10gb and the 2g.20gb slices replaced by two new 1g.10gb: the leased one
    # stays listed
    two = replace(fresh, uuid="MIG-00000005-0000-0000-0000-000000000005", gpu_instance_id=12,
                  index=5)
    with django_capture_on_commit_callbacks(execute=True):
        assert _post(token, _layout(*keep, fresh, two)).status_code == 200
    assert not Gpu.every.filter(uuid=dropped.uuid).exists()  # no lease named it: deleted
    ones = set(node.gpus.filter(gpu_class__slug=ONE_G).values_list("uuid", flat=True))
    assert ones == {leased.uuid, fresh.uuid, two.uuid}
    ask.refresh_from_db()
    assert ask.remaining_gpus == 1  # of 2, one leased; grows back only to its own size

    # MIG disabled, the slices give way to the whole GPU while the lease runs: refused
    whole = [{**runner_mig.inventory_items(H100_MIG)[0], "listed": True, "mig_mode": "Disabled"}]
    assert_refused(_post(token, whole), "gpus", status=409, contains=f"lease {lease.pk}")

    # once the lease has ended, the whole GPU: its slices leave, the 1g ask shrinks to 0
    mark_running(lease=lease, container_id="c1")
    end_lease(lease_id=lease.pk, status="completed", cause="test")
    with django_capture_on_commit_callbacks(execute=True):
        assert _post(token, whole).status_code == 200
    assert [g.uuid for g in node.gpus.all()] == [PARENT]
    retired = Gpu.every.get(uuid=leased.uuid)
    assert not retired.listed and LeaseGpu.objects.filter(gpu=retired).exists()  # kept
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0
    assert book.node_market(node, None).slug == H100
    assert first_violation() is None


def test_a_fatal_finding_on_the_parent_takes_every_slice_out_one_on_a_slice_only_it(
        django_capture_on_commit_callbacks):
    provider, node, token = mig_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=ONE_G,
                         price=400_000, gpus=2, available_until=in_a_day()).order
    one, other = sorted(node.gpus.filter(gpu_class__slug=ONE_G).values_list("uuid", flat=True))
    scoped = {"uuid": one, "rule": "xid", "severity": "fatal",
              "evidence": "XID 95 on GPU instance 9"}
    with django_capture_on_commit_callbacks(execute=True):
        assert "warnings" not in _heartbeat(token, [scoped])
    health = dict(node.gpus.values_list("uuid", "healthy"))
    assert [u for u, ok in health.items() if not ok] == [one]
    ask.refresh_from_db()
    assert ask.remaining_gpus == 1

    on_parent = {"uuid": PARENT, "rule": "xid", "severity": "fatal",
                 "evidence": "XID 79 GPU has fallen off the bus"}
    with django_capture_on_commit_callbacks(execute=True):
        assert "warnings" not in _heartbeat(token, [on_parent])
    assert not node.gpus.filter(healthy=True).exists()
    assert node.gpus.get(uuid=other).findings == [on_parent]
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0


def test_a_slice_is_benchmarked_against_its_profiles_share_of_the_datasheet():
    _user, node, token = mig_node()
    one_g = node.gpus.filter(gpu_class__slug=ONE_G).order_by("uuid").first()
    share = one_g.gpu_class  # 1/7 of the H100's figures (marketplace/catalog.py)
    assert (share.bf16_dense_tflops, share.memory_bandwidth_gbps) == (Decimal("141.3"), 478)
    item = {"uuid": one_g.uuid, "correct": True, "bf16_tflops": 120.4,
            "memory_bandwidth_gbps": 401.0}
    url = "/api/v1/runner/benchmarks/"
    body = {"runner_version": "test", "backend": "torch", "results": [item]}
    r = runner_client(token).post(url, body, format="json")
    assert r.status_code == 201, r.content
    score = benchmarks.gpu_score(one_g, GpuBenchmark.objects.get(gpu=one_g))
    assert score.as_api()["summary"] == ("measured 120.4 of 141.3 TFLOPS (BF16 dense); "
                                         "measured 401 of 478 GB/s memory bandwidth")
    # the whole H100's figure is not plausible for a 1g.10gb slice: refused, nothing stored
    whole = {**item, "bf16_tflops": 794.1}
    r = runner_client(token).post(url, {**body, "results": [whole]}, format="json")
    assert_refused(r, "results[0].bf16_tflops", contains="h100-sxm-80gb.1g.10gb datasheet")
    assert GpuBenchmark.objects.filter(gpu=one_g).count() == 1
