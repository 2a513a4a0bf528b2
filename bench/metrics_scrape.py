"""What a Prometheus scrape costs (ms, bytes) with 1,000 nodes of 8 GPUs (issue 16's target:
under 250 ms and 5 MB): the marketplace's /metrics over HTTP, and one runner's /metrics.

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated); `--nodes`
nodes, each registered through the real services with the recorded 8 × H100 inventory
(UUIDs derived per node), one heartbeat each, one standing ask of its 8 GPUs at a price
of its own; `--bids` funded buyers' bids of 2 GPUs that fill (leases pending) and as many
resting below the asks. The metrics of that setup (this process) are in a fresh
PROMETHEUS_MULTIPROC_DIR, which the server (uvicorn, marketplace.asgi:application, its
own process) reads as well.

Timed: `--scrapes` GETs of /metrics with the bearer token, one after another (what one
Prometheus does every interval): p50/p99/max ms and the answer's size. Then the runner's
exposition for the recorded 8 × H100 host (providers/runner/metrics.py, the NVML layer
reading the dump), rendered `--scrapes` times in process: ms and bytes per runner, and
the bytes Prometheus takes in per interval from `--nodes` runners.

    .venv/bin/python bench/metrics_scrape.py [--nodes 1000] [--bids 200] [--scrapes 50]
                                             [--db gpumarket_metrics_bench] [--port 28390]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
TOKEN = "bench-metrics-token-0123456789abcdef"


def set_up(nodes: int, bids: int) -> None:
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace import book
    from providers import services as provider_services
    from providers.runner.nvsmi import parse_dump
    from settlement import services as ledger

    User = get_user_model()
    inv = parse_dump(DUMP)
    owner = User.objects.create(username="bench-provider", password="!")
    provider = provider_services.provider_onboard(user_id=owner.pk, display_name="Bench")
    until = timezone.now() + timedelta(days=2)
    for i in range(nodes):
        node = provider_services.node_create(provider=provider, name=f"node-{i}").node
        gpus = [{**g.as_protocol(), "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'{i}{g.uuid}')}"}
                for g in inv.gpus]
        provider_services.inventory_record(
            node=node, hostname=f"node-{i}", driver_version=inv.driver_version,
            cuda_version=inv.cuda_version, runner_version="bench", source="simulate",
            gpus=gpus)
        provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])
        book.place_ask(provider_id=owner.pk, node_id=node.pk, market_slug=None,
                       price=2_000_000 + i * 1_000, gpus=8, available_until=until)
        if i % 100 == 99:
            print(f"  {i + 1} nodes", flush=True)
    buyer = User.objects.create(username="bench-buyer", password="!")
    ledger.dev_credit(user_id=buyer.pk, amount=10**12)
    for i in range(bids):
        book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=3_000_000,
                       gpus=2, duration_seconds=3600)  # fills: a lease
        book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                       price=1_000_000 + i * 1_000, gpus=1, duration_seconds=3600)  # rests


def runner_cost(scrapes: int) -> tuple[list[float], int]:
    from prometheus_client import CollectorRegistry, generate_latest

    from providers.runner.agent import Agent
    from providers.runner.client import MarketplaceClient
    from providers.runner.metrics import DcgmCollector
    from providers.runner.nvml import DumpGpus

    agent = Agent(MarketplaceClient("http://127.0.0.1:9", "x" * 32), DumpGpus(DUMP), None,
                  log=lambda _line: None)
    registry = CollectorRegistry()
    registry.register(DcgmCollector(agent))
    times, size = [], 0
    for _ in range(scrapes):
        t0 = time.perf_counter()
        size = len(generate_latest(registry))
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--bids", type=int, default=200)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--db", default="gpumarket_metrics_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=28390)
    args = ap.parse_args()

    multiproc = tempfile.mkdtemp(prefix="gpumarket-metrics-bench-")
    env = {**server_env(fresh_database(args.pg, args.db)), "GPUMARKET_METRICS_TOKEN": TOKEN,
           "PROMETHEUS_MULTIPROC_DIR": multiproc}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    t0 = time.monotonic()
    set_up(args.nodes, args.bids)
    print(f"setup: {args.nodes} nodes × 8 GPUs, {args.bids} leases, {args.bids} resting bids "
          f"in {time.monotonic() - t0:.0f} s")
    from django.db import connections

    connections.close_all()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host", "127.0.0.1",
         "--port", str(args.port), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{args.port}/metrics"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.get(url, headers=headers).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            times, size, series = [], 0, 0
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                answer = client.get(url, headers=headers)
                times.append((time.perf_counter() - t0) * 1000)
                assert answer.status_code == 200, answer.status_code
                size = len(answer.content)
                series = sum(1 for line in answer.text.splitlines()
                             if line and not line.startswith("#"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    times.sort()
    files = len(os.listdir(multiproc))
    r_times, r_size = runner_cost(args.scrapes)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} (1 min, at the end); database {args.db}")
    print(f"marketplace /metrics over HTTP, {args.nodes} nodes × 8 GPUs ({files} files in "
          f"PROMETHEUS_MULTIPROC_DIR): p50 {pct(times, 50):.1f} ms, p99 {pct(times, 99):.1f} "
          f"ms, max {times[-1]:.1f} ms; {size:,} bytes, {series:,} samples")
    print(f"runner /metrics (8 GPUs, in process): p50 {pct(r_times, 50):.2f} ms, p99 "
          f"{pct(r_times, 99):.2f} ms; {r_size:,} bytes per runner, "
          f"{r_size * args.nodes / 1e6:.1f} MB per interval from {args.nodes} runners")


if __name__ == "__main__":
    main()
