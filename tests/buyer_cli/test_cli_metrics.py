"""`gpumarket metrics LEASE` (docs/CLI.md) against a live server: the runner's heartbeat
telemetry as a table per GPU, `--json` the API's body, another buyer's lease refused."""

from __future__ import annotations

import json

import httpx

from marketplace.models import Lease
from tests.factories import H100, UserFactory

IMAGE = "gpumarket/busybox:local"


def test_metrics_shows_the_gpus_latest_reading_and_json_the_series(gm, market):
    gm.login(market.buyer)
    done = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--json",
              "--image", IMAGE)
    assert done.returncode == 0, done.stderr
    [lease_id] = json.loads(done.stdout)["leases"]
    assert "no readings yet" in gm("metrics", str(lease_id)).stdout
    market.run(lease_id)
    [uuid] = Lease.objects.get(pk=lease_id).lease_gpus.values_list("gpu__uuid", flat=True)
    beat = httpx.post(f"{market.url}/api/v1/runner/heartbeat/", timeout=10,
                      headers={"Authorization": f"Bearer {market.runner_token}"},
                      json={"runtime": "docker", "telemetry": [{"lease": lease_id, "gpus": [
                          {"uuid": uuid, "utilization_pct": 93, "fb_used_mib": 40960,
                           "power_w": 650.5, "temperature_c": 71, "sm_clock_mhz": 1755,
                           "mem_clock_mhz": 2619, "throttle_reasons": ["sw_power_cap"]}]}]})
    assert beat.status_code == 200 and "telemetry_errors" not in beat.json(), beat.text

    human = gm("metrics", str(lease_id))
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == f"lease {lease_id}: 1h in 10 s buckets"
    assert lines[1].split() == ["GPU", "LAST", "AT", "UTIL", "%", "MEAN", "%", "PEAK", "%",
                                "MEM", "MiB", "POWER", "W", "TEMP", "C", "SM", "MHz", "MEM",
                                "MHz", "THROTTLE"]
    row = lines[2].split()
    assert row[0] == uuid and row[2:] == ["93.0", "93.0", "93.0", "40960.0", "650.5", "71.0",
                                          "1755.0", "2619.0", "sw_power_cap"]
    day = json.loads(gm("metrics", str(lease_id), "--range", "24h", "--json").stdout)
    assert day["resolution_seconds"] == 60 and day["gpus"][0]["utilization_pct"] == [93.0]

    gm.login(UserFactory())
    other = gm("metrics", str(lease_id))
    assert other.returncode != 0 and f"no lease {lease_id} of yours" in other.stderr
