"""Per-lease GPU telemetry (marketplace/telemetry.py) through the runner's heartbeat and
the buyer's GET /api/v1/leases/<id>/metrics/: readings kept, bad ones refused alone,
downsampling and the row bound, privacy, idle detection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from marketplace import leases, telemetry
from marketplace.lease_end import end_lease
from marketplace.models import LeaseSample
from providers.models import Gpu
from tests.factories import UserFactory, ask, bid, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client

pytestmark = pytest.mark.django_db
PRICE = 2_490_000


def _running(gpus: int = 2):
    provider, node, token = registered_node()
    ask(provider, node, price=PRICE, gpus=8)
    buyer = funded_buyer(100)
    [lease] = bid(buyer, price=PRICE, gpus=gpus, duration_seconds=3600).leases
    lease = leases.mark_running(lease=lease, container_id="c" * 64)
    return provider, buyer, lease, node, token


def _reading(uuid, util=50, **more):
    return {"uuid": uuid, "utilization_pct": util, "fb_used_mib": 1024, "power_w": 312.5,
            "temperature_c": 61, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
            "throttle_reasons": [], **more}


def _beat(token, items, **body):
    r = runner_client(token).post("/api/v1/runner/heartbeat/",
                                  {"runtime": "docker", "telemetry": items, **body},
                                  format="json")
    assert r.status_code == 200, r.content
    return r.json()


def test_a_heartbeat_keeps_each_gpus_reading_in_both_resolutions():
    _, buyer, lease, _, token = _running()
    uuids = leases.gpu_uuids(lease)
    answer = _beat(token, [{"lease": lease.pk, "gpus": [
        _reading(uuids[0], 40, throttle_reasons=["hw_power_brake"]), _reading(uuids[1], 80)]}])
    assert "telemetry_errors" not in answer
    assert LeaseSample.objects.filter(lease=lease).count() == 4  # 2 GPUs × (10 s, 60 s)
    body = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/?range=1h").json()
    assert body["resolution_seconds"] == 10 and body["range"] == "1h"
    got = {g["uuid"]: g for g in body["gpus"]}
    assert got[uuids[0]]["utilization_pct"] == [40.0]
    assert got[uuids[0]]["power_w"] == [312.5]
    assert got[uuids[0]]["throttle_reasons"] == [["hw_power_brake"]]
    assert got[uuids[1]]["utilization_pct"] == [80.0]
    day = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/?range=24h").json()
    assert day["resolution_seconds"] == 60 and len(day["gpus"]) == 2


def test_a_gpu_not_in_the_lease_is_refused_and_the_rest_applies():
    _, _, lease, node, token = _running(gpus=1)
    [mine] = leases.gpu_uuids(lease)
    other = Gpu.objects.filter(node=node).exclude(uuid=mine).first().uuid
    answer = _beat(token, [{"lease": lease.pk, "gpus": [_reading(mine), _reading(other)]},
                           {"lease": 999999, "gpus": [_reading(mine)]},
                           {"lease": lease.pk, "gpus": []}],
                   gpus=[{"uuid": mine, "temperature_c": 55}])
    assert answer["telemetry_errors"] == [
        f"telemetry[0].gpus[1].uuid: '{other}' is not a GPU of this lease; refused",
        "telemetry[1].lease: 999999 is not a running lease of this node (or is sent "
        "twice); refused",
        f"telemetry[2].lease: {lease.pk} is not a running lease of this node (or is sent "
        "twice); refused"]
    assert set(LeaseSample.objects.values_list("gpu_uuid", flat=True)) == {mine}
    # the heartbeat itself applied: the GPU's reading is stored
    assert Gpu.objects.get(uuid=mine).last_health["temperature_c"] == 55


def test_values_out_of_range_are_refused_naming_the_field():
    _, _, lease, _, token = _running(gpus=2)
    a, b = leases.gpu_uuids(lease)
    answer = _beat(token, [{"lease": lease.pk, "gpus": [
        _reading(a, 101), _reading(b, throttle_reasons=["rm -rf"]), {"uuid": a, "x": 1},
        _reading(a, True), _reading(b, power_w=10**400)]},
        {"lease": 10**30, "gpus": []}, {"lease": "1", "gpus": []}, "x",
        {"lease": [1], "gpus": []}])
    assert answer["telemetry_errors"] == [
        "telemetry[0].gpus[0].utilization_pct: must be a number from 0 to 100 or null; refused",
        "telemetry[0].gpus[1].throttle_reasons: must be a list of hw_thermal_slowdown, "
        "hw_power_brake, hw_slowdown, sw_thermal_slowdown, sw_power_cap; refused",
        "telemetry[0].gpus[2].x: is not a known field; refused",
        "telemetry[0].gpus[3].utilization_pct: must be a number from 0 to 100 or null; refused",
        "telemetry[0].gpus[4].power_w: must be a number from 0 to 10000 or null; refused",
        "telemetry[1].lease: 10000000000000000000 is not a running lease of this node (or is "
        "sent twice); refused",
        "telemetry[2].lease: 1 is not a running lease of this node (or is sent twice); refused",
        "telemetry[3]: must be an object with lease and gpus",
        "telemetry[4].lease: [1] is not a running lease of this node (or is sent twice); "
        "refused"]
    assert not LeaseSample.objects.exists()


def test_too_many_items_is_a_400_naming_telemetry_and_writes_nothing():
    _, _, lease, _, token = _running()
    r = runner_client(token).post("/api/v1/runner/heartbeat/", {
        "runtime": "docker", "telemetry": [{"lease": lease.pk, "gpus": []}] * 65},
        format="json")
    assert_refused(r, "telemetry")
    assert not LeaseSample.objects.exists()


def test_the_series_is_downsampled_and_bounded_over_a_day_and_more():
    """A reading a minute for 25 hours, then every 10 s for 70 minutes: the lease keeps
    exactly 360 + 1440 rows per GPU (never more at any point), the 60 s buckets holding
    the means of their readings."""
    _, _, lease, node, _ = _running(gpus=2)
    uuids = leases.gpu_uuids(lease)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    times = [start + timedelta(minutes=m) for m in range(25 * 60)]
    times += [times[-1] + timedelta(seconds=10 * s) for s in range(1, 70 * 6)]
    most = 0
    for step, now in enumerate(times):
        util = 20 if (now.second // 10) < 3 else 80  # each minute: 3 × 20 %, 3 × 80 %
        telemetry.record(node=node, now=now, items=[{"lease": lease.pk, "gpus": [
            _reading(u, util) for u in uuids]}])
        if step % 37 == 0:
            most = max(most, LeaseSample.objects.filter(lease=lease).count())
    per_gpu = {u: (LeaseSample.objects.filter(lease=lease, gpu_uuid=u, resolution=10).count(),
                   LeaseSample.objects.filter(lease=lease, gpu_uuid=u, resolution=60).count())
               for u in uuids}
    assert per_gpu == dict.fromkeys(uuids, (360, 1440))
    assert most <= 2 * (360 + 1440)
    minute = LeaseSample.objects.filter(lease=lease, resolution=60).order_by("-bucket_at")[1]
    assert minute.samples == 6 and minute.utilization_pct == pytest.approx(50.0)
    day = telemetry.series(lease, "24h", now=now)
    assert [len(g["at"]) for g in day["gpus"]] == [1440, 1440]
    hour = telemetry.series(lease, "1h", now=now)
    assert [len(g["at"]) for g in hour["gpus"]] == [360, 360]
    assert hour["gpus"][0]["utilization_pct"][-3:] == [80.0, 80.0, 80.0]


def test_only_the_buyer_reads_the_series():
    provider, buyer, lease, _, token = _running()
    _beat(token, [{"lease": lease.pk, "gpus": [_reading(leases.gpu_uuids(lease)[0])]}])
    for user in (UserFactory(), provider):
        r = client_for(user).get(f"/api/v1/leases/{lease.pk}/metrics/")
        assert r.status_code == 404
        assert f"no lease {lease.pk} of yours" in r.content.decode()
    assert client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/").status_code == 200
    assert_refused(client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/?range=7d"),
                   "range")
    assert_refused(client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/?since=1"),
                   "since")


@override_settings(GPUMARKET_IDLE_UTILIZATION_PCT=5, GPUMARKET_IDLE_AFTER_SECONDS=900)
def test_a_lease_under_the_threshold_for_long_enough_is_idle():
    _, buyer, lease, node, _ = _running(gpus=2)
    uuids = leases.gpu_uuids(lease)
    start = timezone.now() - timedelta(minutes=30)

    def feed(minutes_from, minutes_to, util):
        for step in range(minutes_from * 6, minutes_to * 6):
            telemetry.record(node=node, now=start + timedelta(seconds=10 * step),
                             items=[{"lease": lease.pk, "gpus": [
                                 _reading(uuids[0], util), _reading(uuids[1], 0)]}])

    feed(0, 5, 90)  # busy for 5 minutes, then idle for 25
    feed(5, 30, 0)
    lease.refresh_from_db()
    state = telemetry.idle_states([lease])[lease.pk]
    assert state["idle"] is True
    assert 24 * 60 <= state["idle_seconds"] <= 25 * 60 + 10
    gross = PRICE * 2  # 2 GPUs at 2.49 USD per GPU-hour
    assert state["paying_usd_per_hour"] == "4.980000" and gross == 4_980_000
    assert state["text"] in {"0 % for 24 min — paying $4.98/h",
                             "0 % for 25 min — paying $4.98/h"}
    api = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/metrics/").json()
    assert api["idle"]["idle"] is True
    # one GPU busy again: no longer idle
    telemetry.record(node=node, items=[{"lease": lease.pk, "gpus": [_reading(uuids[1], 60)]}])
    assert telemetry.idle_states([lease])[lease.pk]["idle"] is False


@override_settings(GPUMARKET_IDLE_UTILIZATION_PCT=5, GPUMARKET_IDLE_AFTER_SECONDS=900)
def test_a_lease_idle_for_less_than_the_setting_is_not_idle():
    _, _, lease, node, _ = _running(gpus=1)
    [uuid] = leases.gpu_uuids(lease)
    start = timezone.now() - timedelta(minutes=10)
    for step in range(60):
        telemetry.record(node=node, now=start + timedelta(seconds=10 * step),
                         items=[{"lease": lease.pk, "gpus": [_reading(uuid, 0)]}])
    assert telemetry.idle_states([lease])[lease.pk]["idle"] is False


def test_the_series_of_a_lease_ended_over_a_day_ago_is_dropped_by_the_sweep():
    _, _, lease, _, token = _running(gpus=1)
    [running] = bid(funded_buyer(100), price=PRICE, gpus=1, duration_seconds=3600).leases
    running = leases.mark_running(lease=running, container_id="d" * 64)
    _beat(token, [{"lease": one.pk, "gpus": [_reading(leases.gpu_uuids(one)[0])]}
                  for one in (lease, running)])
    end_lease(lease_id=lease.pk, status="completed", cause="test")
    assert telemetry.drop_ended() == 0  # ended just now: still the buyer's to read
    later = timezone.now() + timedelta(days=1, seconds=1)
    assert telemetry.drop_ended(now=later) == 2  # its 10 s and 60 s bucket
    assert not LeaseSample.objects.filter(lease=lease).exists()
    assert LeaseSample.objects.filter(lease=running).count() == 2  # a running one stays
