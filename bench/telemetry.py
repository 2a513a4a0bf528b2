"""What per-lease telemetry adds to a runner's heartbeat (issue 16): CPU time in the web
process and SQL statements (writes apart), with and without `telemetry`.

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated); one node
registered through the real services with the recorded 8 × H100 inventory, an ask of its
8 GPUs and `--leases` filled bids (8 // leases GPUs each), all marked running.

Timed: `--beats` heartbeats of that node through the real view (DRF, runner-token auth,
providers' heartbeat_record, then marketplace/telemetry.record), in process, the same
body each time but for `telemetry` — alone, then with every GPU of every lease (both
series written, the expired buckets deleted). Per heartbeat: p50/p99 CPU ms of this
process (`time.process_time`: PostgreSQL's own work is not in it), p50 wall ms, and the
SQL statements Django sent (CaptureQueriesContext), INSERT/UPDATE/DELETE counted as
writes. Then the rows per GPU after `--beats` beats.

    .venv/bin/python bench/telemetry.py [--leases 8] [--beats 300] [--db gpumarket_telemetry_bench]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"


def set_up(leases: int):
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace import book
    from marketplace import leases as lease_services
    from marketplace.models import Lease
    from providers import services as provider_services
    from providers.runner.nvsmi import parse_dump
    from settlement import services as ledger

    User = get_user_model()
    inv = parse_dump(DUMP)
    owner = User.objects.create(username="bench-provider", password="!")
    provider = provider_services.provider_onboard(user_id=owner.pk, display_name="Bench")
    created = provider_services.node_create(provider=provider, name="node-0")
    provider_services.inventory_record(
        node=created.node, hostname="node-0", driver_version=inv.driver_version,
        cuda_version=inv.cuda_version, runner_version="bench", source="simulate",
        gpus=[g.as_protocol() for g in inv.gpus])
    provider_services.heartbeat_record(node=created.node, runtime="docker", gpus=[])
    book.place_ask(provider_id=owner.pk, node_id=created.node.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=timezone.now() + timedelta(days=2))
    buyer = User.objects.create(username="bench-buyer", password="!")
    ledger.dev_credit(user_id=buyer.pk, amount=10**12)
    for _ in range(leases):
        book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=3_000_000,
                       gpus=8 // leases, gang_size=8 // leases, duration_seconds=7200)
    running = []
    for lease in Lease.objects.filter(node=created.node).order_by("pk"):
        running.append(lease_services.mark_running(lease=lease, container_id="c" * 64))
    return created, running, [g.as_protocol() for g in inv.gpus]


def body(gpus: list[dict], leases, with_telemetry: bool) -> dict:
    from marketplace import leases as lease_services

    readings = [{"uuid": g["uuid"], "temperature_c": 61, "power_w": 312.5,
                 "utilization_pct": 87, "ecc_uncorrectable": 0} for g in gpus]
    out = {"runtime": "docker", "gpus": readings, "findings": []}
    if with_telemetry:
        out["telemetry"] = [{"lease": lease.pk, "gpus": [
            {"uuid": u, "utilization_pct": 87, "fb_used_mib": 40960, "power_w": 312.5,
             "temperature_c": 61, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
             "throttle_reasons": []} for u in lease_services.gpu_uuids(lease)]}
            for lease in leases]
    return out


def run(view, token: str, payload: dict, beats: int):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIRequestFactory

    factory = APIRequestFactory()
    cpu, wall, statements, writes = [], [], [], []
    for _ in range(beats):
        request = factory.post("/api/v1/runner/heartbeat/", payload, format="json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as seen:
            c0, w0 = time.process_time(), time.perf_counter()
            answer = view(request)
            cpu.append((time.process_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        assert answer.status_code == 200, answer.data
        assert "telemetry_errors" not in answer.data, answer.data
        sql = [q["sql"].lstrip().split(None, 1)[0].upper() for q in seen.captured_queries]
        statements.append(len(sql))
        writes.append(sum(s in ("INSERT", "UPDATE", "DELETE") for s in sql))
        time.sleep(0.01)
    print(f"  statements of the last beat: {' '.join(sql)}")
    return sorted(cpu), sorted(wall), statements, writes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=8, choices=[1, 2, 4, 8])
    ap.add_argument("--beats", type=int, default=300)
    ap.add_argument("--db", default="gpumarket_telemetry_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    args = ap.parse_args()

    env = server_env(fresh_database(args.pg, args.db))
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    created, leases, gpus = set_up(args.leases)
    from marketplace.api.telemetry import RunnerHeartbeat
    from marketplace.models import LeaseSample

    view = RunnerHeartbeat.as_view()
    print(f"setup: 1 node of 8 × H100, {len(leases)} running leases; {args.beats} heartbeats "
          f"each way; {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    results = {}
    for name, flag in (("without telemetry", False), ("with telemetry", True)):
        results[name] = run(view, created.runner_token, body(gpus, leases, flag), args.beats)
    print("| heartbeat | CPU p50 ms | CPU p99 ms | wall p50 ms | statements | writes |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (cpu, wall, statements, writes) in results.items():
        print(f"| {name} | {pct(cpu, 50):.2f} | {pct(cpu, 99):.2f} | {pct(wall, 50):.2f} | "
              f"{max(set(statements), key=statements.count)} | "
              f"{max(set(writes), key=writes.count)} |")
    per_gpu = LeaseSample.objects.count() / 8
    print(f"rows after the run: {per_gpu:.0f} per GPU (bound 360 + 1440); load average now "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
