"""Group commit of heartbeats (marketplace/api/heartbeat_batch.py): a group is answered
beat by beat as the single path answers each (a refusal, an unknown token, warnings,
telemetry errors), in a fixed number of statements; a flip and a node's second beat are
recorded alone; a failed group is recorded beat by beat, none dropped."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace import leases
from marketplace.api import heartbeat_batch
from marketplace.api.heartbeat_path import lean_heartbeat
from marketplace.models import LeaseSample
from providers import heartbeat
from providers.models import Gpu, Node
from tests.factories import ask, bid, funded_buyer, registered_node

pytestmark = pytest.mark.django_db
PRICE = 2_490_000


def _pending(token: str, body: dict) -> heartbeat_batch._Pending:
    beat = lean_heartbeat(body)
    assert beat is not None
    return heartbeat_batch._Pending(token, beat, "req", None, None)


def _uuids(node) -> list[str]:
    return list(Gpu.objects.filter(node=node).order_by("pk").values_list("uuid", flat=True))


def _reading(uuid: str, power: float = 70.5) -> dict:
    return {"uuid": uuid, "temperature_c": 40, "power_w": power, "utilization_pct": 3,
            "ecc_uncorrectable": 0}


def _sample(uuid: str) -> dict:
    return {"uuid": uuid, "utilization_pct": 90, "fb_used_mib": 1024, "power_w": 300.0,
            "temperature_c": 61, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
            "throttle_reasons": []}


def test_a_group_answers_each_beat_as_alone_in_a_fixed_number_of_statements():
    fleet = [registered_node(name=f"node-{i}", own_uuids=True) for i in range(4)]
    provider, leased_node, leased_token = fleet[0]
    ask(provider, leased_node, price=PRICE, gpus=8)
    [lease] = bid(funded_buyer(100), price=PRICE, gpus=2, duration_seconds=3600).leases
    lease = leases.mark_running(lease=lease, container_id="c" * 64)
    mine = leases.gpu_uuids(lease)
    group = [
        _pending(leased_token, {"runtime": "docker",
                                "gpus": [_reading(u) for u in _uuids(leased_node)],
                                "telemetry": [{"lease": lease.pk, "gpus": [
                                    _sample(mine[0]), _sample("GPU-not-mine")]}]}),
        _pending(fleet[1][2], {"runtime": "process",
                               "gpus": [_reading("GPU-nobody")],
                               "findings": [{"uuid": _uuids(fleet[1][1])[0],
                                             "rule": "hw_power_brake", "severity": "warn"}]}),
        _pending(fleet[2][2], {"gpus": [_reading(f"GPU-{i}") for i in range(9)]}),
        _pending("gmr_no-such-token", {"gpus": []}),
        _pending(fleet[3][2], {"runtime": "docker", "gpus": []}),
    ]
    batcher = heartbeat_batch.HeartbeatBatcher(256)
    with CaptureQueriesContext(connection) as seen:
        outcomes = batcher._outcomes(group)
    statements = [q["sql"] for q in seen.captured_queries
                  if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    # the nodes, their units; the nodes' and GPUs' update; the samples' upsert (and
    # the transaction's begin and commit, a savepoint here, inside the test's)
    assert len(statements) == 4, statements
    assert batcher.stats["alone"] == 0 and batcher.stats["grouped"] == 5
    first, second, refused, unknown, last = outcomes
    assert first[0] == 200 and "warnings" not in first[1]
    assert first[1]["telemetry_errors"] == [
        "telemetry[0].gpus[1].uuid: 'GPU-not-mine' is not a GPU of this lease; refused"]
    assert LeaseSample.objects.filter(lease=lease).count() == 2  # 1 GPU × (10 s, 60 s)
    assert second[0] == 200 and second[1]["warnings"] == [
        "gpus[0].uuid: GPU-nobody is not a GPU of this node; ignored"]
    assert refused[0] == 400 and "9 readings" in str(refused[1])
    assert isinstance(unknown, heartbeat_batch.Unknown)
    assert last == (200, {"server_time": last[1]["server_time"]})
    stored = Gpu.objects.get(uuid=_uuids(leased_node)[0]).last_health
    assert stored["power_w"] == 70.5 and stored["at"]
    assert Gpu.objects.get(uuid=_uuids(fleet[1][1])[0]).findings[0]["rule"] == "hw_power_brake"
    assert Node.objects.get(pk=fleet[1][1].pk).runtime == "process"
    refused_node = Node.objects.get(pk=fleet[2][1].pk)
    assert refused_node.last_heartbeat_at == fleet[2][1].last_heartbeat_at  # nothing applied


def test_a_flip_and_a_second_beat_of_a_node_are_recorded_alone():
    _p, node, token = registered_node()
    uuids = _uuids(node)
    fatal = {"runtime": "docker", "gpus": [_reading(uuids[1])],
             "findings": [{"uuid": uuids[1], "rule": "xid_79", "severity": "fatal"}]}
    again = {"runtime": "docker", "gpus": [_reading(uuids[1], power=99.5)],
             "findings": [{"uuid": uuids[1], "rule": "xid_79", "severity": "fatal"}]}
    batcher = heartbeat_batch.HeartbeatBatcher(256)
    outcomes = batcher._outcomes([_pending(token, fatal), _pending(token, again)])
    assert [o[0] for o in outcomes] == [200, 200]
    assert batcher.stats["alone"] == 2
    gpu = Gpu.every.get(uuid=uuids[1])
    assert not gpu.healthy and gpu.last_health["power_w"] == 99.5  # the second, after


def test_a_failed_group_records_each_beat_alone(monkeypatch):
    fleet = [registered_node(name=f"node-{i}", own_uuids=True) for i in range(3)]
    real, calls = heartbeat.write_beats, []

    def fails_once(beats):
        calls.append(len(beats))
        if len(calls) == 1:
            raise RuntimeError("the group's statement failed")
        return real(beats)

    monkeypatch.setattr(heartbeat, "write_beats", fails_once)
    batcher = heartbeat_batch.HeartbeatBatcher(256)
    group = [_pending(t, {"runtime": "docker", "gpus": [_reading(_uuids(n)[0], 80.5)]})
             for _p, n, t in fleet]
    outcomes = batcher._outcomes(group)
    assert [o[0] for o in outcomes] == [200, 200, 200]
    assert calls == [3, 1, 1, 1] and batcher.stats["failed"] == 1
    for _p, n, _t in fleet:
        assert Gpu.objects.get(uuid=_uuids(n)[0]).last_health["power_w"] == 80.5
