"""The runner at work: its resident memory and CPU per heartbeat, idle and serving 8
leases (issue 17, "The runner": under 50 MB serving 8 leases).

Setup as bench/handoff.py (fresh database, uvicorn, the real runner registered with
`--simulate` of 8 recorded H100s, Docker runtime, `--network none`), with the runner's
heartbeat every `--heartbeat-interval` s. Two windows of `--seconds` each, measured on the
runner's own process (`/proc/<pid>`; Docker's processes are not the runner's): idle (no
lease), then with 8 one-GPU leases running `sleep`. For each: VmRSS at the end, VmHWM
(peak), CPU seconds (utime + stime) over the window and the heartbeats the marketplace
received in it (distinct `last_heartbeat_at` values, polled every 20 ms) → CPU ms per
heartbeat (the loop's lease polls and log tails included: what a heartbeat period costs).

    .venv/bin/python bench/runner_memory.py [--seconds 60] [--heartbeat-interval 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.handoff import IMAGE, set_up, wait  # noqa: E402
from bench.stack import Stack, migrated_database  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def window(pid: int, node_id: int, seconds: float) -> dict:
    from providers.models import Node

    seen, last = 0, None
    cpu0 = cpu_seconds(pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        at = Node.objects.filter(pk=node_id).values_list("last_heartbeat_at", flat=True)[0]
        if at != last:
            seen, last = seen + (last is not None), at
        time.sleep(0.02)
    cpu = cpu_seconds(pid) - cpu0
    return {"rss_mb": status_kb(pid, "VmRSS") / 1024, "hwm_mb": status_kb(pid, "VmHWM") / 1024,
            "cpu_s": cpu, "heartbeats": seen,
            "ms_per_heartbeat": cpu * 1000 / seen if seen else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--heartbeat-interval", type=float, default=2.0)
    ap.add_argument("--leases", type=int, default=8)
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_runner_memory")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8393)
    args = ap.parse_args()

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(IMAGE)
    env = migrated_database(args.pg, args.db, args.redis)
    provider_id, node_id, buyer_id, token = set_up()

    from datetime import timedelta

    from django.utils import timezone

    from marketplace import book
    from marketplace.models import Lease

    results = {}
    with Stack(args.port, token, env, prefix="runner-memory", run_args=(
            "--heartbeat-interval", str(args.heartbeat_interval), "--grace", "1")) as stack:
        stack.wait_heartbeat(node_id)
        time.sleep(args.heartbeat_interval * 2)  # past start-up
        results["idle"] = window(stack.runner.pid, node_id, args.seconds)
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=8, available_until=timezone.now() + timedelta(days=2))
        for _ in range(args.leases):
            book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb", price=2_490_000,
                           gpus=1, duration_seconds=3600, image=IMAGE,
                           command=["sleep", "3600"])
        wait(lambda: Lease.objects.filter(status="running").count() == args.leases, 60,
             f"{args.leases} leases running", step=0.1)
        time.sleep(args.heartbeat_interval * 2)
        results[f"{args.leases} leases"] = window(stack.runner.pid, node_id, args.seconds)

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, docker "
          f"{docker_client.version().get('Version')}; heartbeat every "
          f"{args.heartbeat_interval:g} s, windows of {args.seconds:g} s; load average "
          f"{os.getloadavg()[0]:.1f}")
    for name, r in results.items():
        print(f"{name}: RSS {r['rss_mb']:.1f} MB (peak {r['hwm_mb']:.1f}), CPU "
              f"{r['cpu_s']:.2f} s over {r['heartbeats']} heartbeats = "
              f"{r['ms_per_heartbeat']:.1f} ms per heartbeat period")


if __name__ == "__main__":
    main()
