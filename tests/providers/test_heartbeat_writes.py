"""providers.services.heartbeat_record writes only what changed (issue 17): the statements
a heartbeat sends, counted with CaptureQueriesContext on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from providers import heartbeat, services
from providers.models import Gpu
from providers.runner.nvml import DumpGpus
from providers.signals import gpu_health_changed
from tests.factories import H100_DUMP, registered_node

pytestmark = pytest.mark.django_db


def readings(node) -> list[dict]:
    """The dump's readings under the node's UUIDs (pci bus id order), as the runner sends."""
    source = DumpGpus(H100_DUMP)
    dump = sorted(source.inventory().gpus, key=lambda g: g.pci_bus_id)
    mine = list(Gpu.objects.filter(node=node).order_by("pci_bus_id").values_list("uuid",
                                                                                  flat=True))
    out = []
    for g, uuid in zip(dump, mine, strict=True):
        [r] = source.sample_health([g.uuid])
        out.append({"uuid": uuid, "temperature_c": r["temperature_c"],
                    "power_w": r["power_w"], "utilization_pct": r["utilization_pct"],
                    "ecc_uncorrectable": r["ecc_uncorrectable"]})
    return out


def beat(node, gpus, findings=()) -> list[str]:
    """One heartbeat as the view sends it; the SQL it sent."""
    with CaptureQueriesContext(connection) as seen:
        services.heartbeat_record(node=node, runtime="docker", gpus=gpus,
                                  findings=list(findings))
    return [q["sql"] for q in seen.captured_queries]


def gpu_writes(sql: list[str]) -> list[str]:
    return [s for s in sql if 'UPDATE "providers_gpu"' in s or "UPDATE providers_gpu" in s]


def test_a_heartbeat_with_nothing_changed_writes_no_gpu_row():
    _user, node, _token = registered_node()
    gpus = readings(node)
    first = beat(node, gpus)
    assert len(gpu_writes(first)) == 1  # all eight readings are new: one statement
    stored = {g.uuid: g.last_health for g in Gpu.objects.filter(node=node)}
    assert all(h["at"] for h in stored.values())
    again = beat(node, gpus)
    assert gpu_writes(again) == [] and not any("FOR UPDATE" in s for s in again)
    assert len(again) == 2  # the units' SELECT and the node's UPDATE (its heartbeat time)
    node.refresh_from_db()
    assert node.last_heartbeat_at > min(
        heartbeat._reading_at(h) for h in stored.values())
    assert {g.uuid: g.last_health for g in Gpu.objects.filter(node=node)} == stored


def test_one_changed_reading_rewrites_that_gpu_only_in_one_statement():
    _user, node, _token = registered_node()
    gpus = readings(node)
    beat(node, gpus)
    before = {g.uuid: g.last_health for g in Gpu.objects.filter(node=node)}
    gpus[3] = {**gpus[3], "power_w": gpus[3]["power_w"] + 1.5}
    sql = beat(node, gpus)
    assert len(gpu_writes(sql)) == 1 and not any("FOR UPDATE" in s for s in sql)
    after = {g.uuid: g.last_health for g in Gpu.objects.filter(node=node)}
    changed = [u for u in after if after[u] != before[u]]
    assert changed == [gpus[3]["uuid"]]
    assert after[gpus[3]["uuid"]]["power_w"] == gpus[3]["power_w"]
    assert after[gpus[3]["uuid"]]["at"] > before[gpus[3]["uuid"]]["at"]


def test_an_unchanged_reading_is_rewritten_once_its_time_is_old():
    _user, node, _token = registered_node()
    gpus = readings(node)
    beat(node, gpus)
    old = Gpu.objects.get(uuid=gpus[0]["uuid"])
    at = heartbeat._reading_at(old.last_health) - timedelta(
        seconds=heartbeat.HEALTH_AT_REFRESH_SECONDS + 1)
    old.last_health = {**old.last_health, "at": at.isoformat()}
    old.save(update_fields=["last_health"])
    sql = beat(node, gpus)
    assert len(gpu_writes(sql)) == 1
    assert heartbeat._reading_at(Gpu.objects.get(pk=old.pk).last_health) > at


def test_a_warn_finding_is_stored_once_and_not_rewritten():
    _user, node, _token = registered_node()
    gpus = readings(node)
    warn = [{"uuid": gpus[1]["uuid"], "rule": "hw_power_brake", "severity": "warn",
             "evidence": "HW power brake active"}]
    beat(node, gpus, warn)
    assert Gpu.objects.get(uuid=gpus[1]["uuid"]).findings == warn
    assert gpu_writes(beat(node, gpus, warn)) == []
    sql = beat(node, gpus)  # the warning is gone: that GPU's findings are cleared
    assert len(gpu_writes(sql)) == 1 and not any("FOR UPDATE" in s for s in sql)
    assert Gpu.objects.get(uuid=gpus[1]["uuid"]).findings == []


def test_a_health_flip_takes_the_lock_and_notifies(django_capture_on_commit_callbacks):
    _user, node, _token = registered_node()
    gpus = readings(node)
    beat(node, gpus)
    heard: list[dict] = []

    def listen(sender, **kwargs):
        heard.append(kwargs)

    gpu_health_changed.connect(listen)
    try:
        fatal = [{"uuid": gpus[2]["uuid"], "rule": "ecc_uncorrectable", "severity": "fatal",
                  "evidence": "1 uncorrectable ECC error(s)"}]
        with django_capture_on_commit_callbacks(execute=True):
            sql = beat(node, gpus, fatal)
        assert any("FOR UPDATE" in s for s in sql)
        sick = Gpu.objects.get(uuid=gpus[2]["uuid"])
        assert not sick.healthy and sick.unhealthy_since and sick.findings == fatal
        assert [h["unhealthy"] for h in heard] == [[gpus[2]["uuid"]]]
        with django_capture_on_commit_callbacks(execute=True):
            same = beat(node, gpus, fatal)  # still fatal: no flip, no lock, no notice
        assert not any("FOR UPDATE" in s for s in same) and gpu_writes(same) == []
        assert len(heard) == 1
        with django_capture_on_commit_callbacks(execute=True):
            sql = beat(node, gpus)
        assert any("FOR UPDATE" in s for s in sql)
        assert heard[-1]["recovered"] == [gpus[2]["uuid"]] and heard[-1]["unhealthy"] == []
        assert Gpu.objects.get(uuid=gpus[2]["uuid"]).healthy
    finally:
        gpu_health_changed.disconnect(listen)


def test_too_many_readings_are_refused_and_change_nothing():
    _user, node, _token = registered_node()
    gpus = readings(node)
    before = node.last_heartbeat_at
    with pytest.raises(services.ProviderError) as refused:
        beat(node, [*gpus, {**gpus[0], "uuid": "GPU-0000000-extra"}])
    assert refused.value.field == "gpus"
    node.refresh_from_db()
    assert node.last_heartbeat_at == before
    assert all(g.last_health == {} for g in Gpu.objects.filter(node=node))
