"""Match → container running: how long from a bid matching an ask until the lease's
container runs, with the local image (DESIGN.md target: under 2 s).

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated), one provider
with a node and its runner token, one funded buyer; the marketplace served by uvicorn
(marketplace.asgi:application) on 127.0.0.1, with the Redis channel layer (`--redis`) so
that the runner push notices (`/ws/runner/`) sent after commit by this process reach it;
the real runner (`python -m providers.runner`) registered with `--simulate` (8 recorded
H100s) and running with the Docker runtime, `--network none` and `--poll-interval` (default
2 s, the runner's own default; `--no-push`: HTTP polling only); a standing ask for the
node's 8 GPUs.

Timed, `--leases` times: a bid for 1 GPU placed through the market service (it matches at
once, in its own transaction: t0 is when the lease is committed `pending`); then, polling
every 5 ms, t_docker when the Docker API shows the lease's container running and t_lease
when the runner has reported the lease `running` (started_at set, the lease clock on).
After each, the lease is ended (the runner stops its container) and the next one starts
once the container is gone. Prints p50/p99/max of both and the runner's poll interval.

    .venv/bin/python bench/handoff.py [--leases 30] [--poll-interval 2] [--no-push]
                                      [--redis redis://127.0.0.1:6379/7]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
IMAGE = "gpumarket/busybox:local"


def set_up() -> tuple[int, int, int, str]:
    """Provider, node (runner token), funded buyer → (provider id, node id, buyer id, token)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from providers import services as provider_services
    from settlement import services as ledger

    User = get_user_model()
    owner = User.objects.create(username="handoff-provider", password="!")
    provider = provider_services.provider_onboard(user_id=owner.pk, display_name="Handoff")
    created = provider_services.node_create(provider=provider, name="handoff-node")
    buyer = User.objects.create(username="handoff-buyer", password="!")
    ledger.dev_credit(user_id=buyer.pk, amount=10**12)
    return owner.pk, created.node.pk, buyer.pk, created.runner_token


def wait(predicate, timeout: float, what: str, step: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout} s waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--poll-interval", type=float, default=2.0,
                    help="the runner's seconds between lease polls (default 2, as the runner)")
    ap.add_argument("--no-push", action="store_true",
                    help="run the runner with --no-push: HTTP polling only")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7",
                    help="Redis for the channel layer of this process and the server "
                         "(push notices cross processes through it)")
    ap.add_argument("--db", default="gpumarket_handoff")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8392)
    args = ap.parse_args()

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(IMAGE)  # the local image must exist (scripts/build-test-image.sh)

    database_url = fresh_database(args.pg, args.db)
    env = {**server_env(database_url), "REDIS_URL": args.redis}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    provider_id, node_id, buyer_id, token = set_up()

    from datetime import timedelta

    from django.db import connections
    from django.utils import timezone

    from marketplace import book
    from marketplace.lease_end import end_lease
    from marketplace.models import Lease
    from providers.models import Gpu, Node

    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    state = tempfile.mkdtemp(prefix="handoff-runner-")
    procs = []
    node = None
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
             "127.0.0.1", "--port", str(args.port), "--workers", "1", "--no-access-log",
             "--log-level", "warning"], cwd=ROOT, env=env))
        wait(lambda: _up(base), 30, "uvicorn", step=0.1)
        runner = [sys.executable, "-m", "providers.runner"]
        subprocess.run([*runner, "register", "--url", base, "--token", token, "--simulate",
                        str(DUMP), "--state-dir", state], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        log = open(Path(state) / "runner.log", "w")  # noqa: SIM115 - closed with the runner
        procs.append(subprocess.Popen(
            [*runner, "run", "--state-dir", state, "--runtime", "docker", "--network", "none",
             "--poll-interval", str(args.poll_interval), "--grace", "1",
             *(["--no-push"] if args.no_push else [])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: Node.objects.filter(pk=node_id, last_heartbeat_at__isnull=False).exists(),
             30, "the runner's first heartbeat", step=0.05)
        if not args.no_push:
            wait(lambda: "connected;" in (Path(state) / "runner.log").read_text(), 30,
                 "the runner's push websocket", step=0.05)
        node = Node.objects.get(pk=node_id)
        gpus = Gpu.objects.filter(node=node).count()
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=gpus,
                       available_until=timezone.now() + timedelta(days=2))
        label = f"gpumarket.node={node.uid}"

        to_docker, to_lease = [], []
        for _ in range(args.leases):
            placed = book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb",
                                    price=2_490_000, gpus=1, duration_seconds=3600,
                                    image=IMAGE, command=["sleep", "3600"])
            t0 = time.perf_counter()
            [lease] = placed.leases
            t_docker = t_lease = None
            while t_docker is None or t_lease is None:
                if t_docker is None and docker_client.api.containers(  # no inspect: no race
                        filters={"label": [label, f"gpumarket.lease={lease.pk}"],
                                 "status": "running"}):
                    t_docker = time.perf_counter()
                if t_lease is None and Lease.objects.filter(pk=lease.pk,
                                                            status="running").exists():
                    t_lease = time.perf_counter()
                if time.perf_counter() - t0 > 30:
                    raise SystemExit(f"lease {lease.pk} not running after 30 s; see "
                                     f"{Path(state) / 'runner.log'}")
                time.sleep(0.005)
            to_docker.append(t_docker - t0)
            to_lease.append(t_lease - t0)
            end_lease(lease_id=lease.pk, status="completed", cause="handoff bench: done")
            wait(lambda lid=lease.pk: not docker_client.api.containers(
                all=True, filters={"label": [label, f"gpumarket.lease={lid}"]}),
                30, f"the runner to remove lease {lease.pk}'s container", step=0.02)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        connections.close_all()
        for container in docker_client.containers.list(
                all=True, filters={"label": "gpumarket.lease"}):
            if container.labels.get("gpumarket.node") == str(getattr(node, "uid", "")):
                container.remove(force=True)

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"docker {docker_client.version().get('Version')}; image {IMAGE}; runner poll "
          f"interval {args.poll_interval:g} s, push {'off' if args.no_push else 'on'}; "
          f"{args.leases} leases of 1 GPU")
    for name, values in (("container running (Docker API)", to_docker),
                         ("lease running (runner reported)", to_lease)):
        ms = sorted(v * 1000 for v in values)
        print(f"match → {name}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, "
              f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/api/v1/gpu-classes/", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    main()
