"""Failure → continuation running: how long from a lease failing on node A by a replayed
XID 79 until its continuation runs on node B (issue 15; target: under 10 s p99 plus the
checkpoint's transfer; `--checkpoint-mib N` adds the restore of an N MiB checkpoint).

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated); uvicorn
(marketplace.asgi) on 127.0.0.1 with the Redis channel layer (runner push notices); a real
Celery worker (`--pool solo`) on the Redis broker; two real runners (`python -m
providers.runner run --simulate <1×H200 dump with zeroed UUIDs, each runner its own>
--runtime docker --network none`), each on its own node; one funded buyer.

Each of `--runs` runs: runner A (re)started clean, its GPU healthy and its ask for it
standing; a 1-GPU bid fills on A (image gpumarket/busybox:local, `sleep 3600`) and runs;
node B's ask is placed; runner A is restarted with `--replay-xid` (an XID 79 line for its
GPU): it reports the lease failed, the marketplace queues the failover task after commit,
the worker places the continuation on B, runner B starts it and reports `running`.
Timed: the failed lease's `ended_at` (the failure's commit) → the continuation's
`started_at` (runner B's `running` report), both the marketplace's clock. Then the
continuation is ended and B's ask cancelled. Prints p50/p99/max.

`--checkpoint-mib N` (N > 0): moto's S3 server (tests/support/s3.py, credentials
enforced) on 127.0.0.1; each bid names a checkpoint store in it, and before the failure
(not timed) an N MiB random file is uploaded as the chain's checkpoint with the runner's
own CheckpointStore (as runner A's notice upload would); runner B restores it before the
continuation's workload starts, so the timed span holds the download.

    .venv/bin/python bench/failover.py [--runs 20] [--redis redis://127.0.0.1:6379/7]
                                       [--db gpumarket_failover_bench] [--port 27080]
                                       [--checkpoint-mib 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402
from bench.handoff import _up, wait  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h200-x1.utku-exporter-590.48.01.q-idle.txt"
MARKET = "h200-sxm-141gb"
IMAGE = "gpumarket/busybox:local"
XID_79 = "NVRM: Xid (PCI:0000:83:00): 79, GPU has fallen off the bus.\n"


def set_up():
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from providers import services as provider_services
    from settlement import services as ledger

    User = get_user_model()
    nodes = []
    for name in ("a", "b"):
        owner = User.objects.create(username=f"failover-provider-{name}", password="!")
        provider = provider_services.provider_onboard(user_id=owner.pk, display_name=name)
        created = provider_services.node_create(provider=provider, name=f"node-{name}")
        nodes.append((owner.pk, created.node.pk, created.runner_token))
    buyer = User.objects.create(username="failover-buyer", password="!")
    ledger.dev_credit(user_id=buyer.pk, amount=10**12)
    return nodes, buyer.pk


class Runner:
    def __init__(self, base: str, token: str) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="failover-runner-"))
        self.proc = None
        subprocess.run([sys.executable, "-m", "providers.runner", "register", "--url", base,
                        "--token", token, "--simulate", str(DUMP), "--state-dir",
                        str(self.state)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)

    def start(self, *extra: str) -> None:
        self.stop()
        log = open(self.state / "runner.log", "a")  # noqa: SIM115 - closed with the runner
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(self.state),
             "--runtime", "docker", "--network", "none", "--grace", "1", *extra],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def seed_checkpoint(s3, bucket: str, lease_id: int, src: Path) -> str:
    """Upload `src` as lease `lease_id`'s chain checkpoint with the runner's own store
    (the layout docs/CHECKPOINTS.md gives); returns the manifest's key."""
    from providers.runner.checkpoint import CheckpointStore

    cfg = {"bucket": bucket, "prefix": f"{lease_id}/", "max_bytes": 1 << 40,
           "endpoint_url": s3.endpoint_url, "region": "us-east-1",
           "access_key_id": s3.access_key_id, "secret_access_key": s3.secret_access_key}
    return CheckpointStore(cfg).upload(src, lease_id, "/workspace/checkpoint")["key"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_failover_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=27080)
    ap.add_argument("--checkpoint-mib", type=int, default=0,
                    help="restore an N MiB checkpoint in each continuation (0: none)")
    args = ap.parse_args()

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(IMAGE)
    database_url = fresh_database(args.pg, args.db)
    env = {**server_env(database_url), "REDIS_URL": args.redis,
           "CELERY_BROKER_URL": args.redis, "GPUMARKET_DB_POOL": "0",
           "GPUMARKET_CHECKPOINT_ALLOW_PRIVATE": "1"}  # the store is on 127.0.0.1
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    (a, b), buyer_id = set_up()

    from datetime import timedelta

    from django.db import connections
    from django.utils import timezone

    from marketplace import book
    from marketplace.lease_end import end_lease
    from marketplace.models import Lease, LeaseEvent, Order
    from providers.models import Gpu, Node

    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    xid = Path(tempfile.mkdtemp(prefix="failover-xid-")) / "xid79.log"
    xid.write_text(XID_79)
    procs, runners = [], []
    waits = []
    store = s3 = None
    if args.checkpoint_mib > 0:
        from marketplace import checkpoints
        from tests.support import s3 as moto

        s3_proc, s3 = moto.start()
        procs.append(s3_proc)
        bucket = s3.bucket("failover-bench")
        store = checkpoints.clean({"url": f"s3://{bucket}", "endpoint_url": s3.endpoint_url,
                                   "access_key_id": s3.access_key_id,
                                   "secret_access_key": s3.secret_access_key})
        blob = xid.parent / "checkpoint"
        blob.mkdir()
        (blob / "state.bin").write_bytes(os.urandom(args.checkpoint_mib << 20))
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
             "127.0.0.1", "--port", str(args.port), "--workers", "1", "--no-access-log",
             "--log-level", "warning"], cwd=ROOT, env=env))
        wait(lambda: _up(base), 30, "uvicorn", step=0.1)
        worker_log = open(xid.parent / "worker.log", "w")  # noqa: SIM115
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "solo",
             "--loglevel", "WARNING"], cwd=ROOT, env=env, stdout=worker_log,
            stderr=subprocess.STDOUT))
        runner_a, runner_b = Runner(base, a[2]), Runner(base, b[2])
        runners = [runner_a, runner_b]
        runner_b.start()
        until = timezone.now() + timedelta(days=2)
        for run in range(args.runs):
            runner_a.start()
            wait(lambda: Gpu.objects.filter(node_id=a[1], healthy=True).exists() and
                 Node.objects.get(pk=a[1]).last_heartbeat_at is not None, 60,
                 "node A healthy", step=0.05)
            ask_a = Order.objects.filter(node_id=a[1], side="ask").first()
            if ask_a is None:
                book.place_ask(provider_id=a[0], node_id=a[1], market_slug=MARKET,
                               price=3_000_000, gpus=1, available_until=until)
            wait(lambda: Order.objects.filter(node_id=a[1], side="ask", remaining_gpus=1,
                                              status__in=Order.ACTIVE).exists(), 60,
                 "node A's ask back", step=0.05)
            wait(lambda: Node.objects.get(pk=b[1]).last_heartbeat_at is not None, 60,
                 "node B heard", step=0.05)
            [lease] = book.place_bid(buyer_id=buyer_id, market_slug=MARKET, price=3_000_000,
                                     gpus=1, duration_seconds=3600, image=IMAGE,
                                     command=["sleep", "3600"], checkpoint=store).leases
            wait(lambda lid=lease.pk: Lease.objects.filter(pk=lid, status="running").exists(),
                 60, f"lease {lease.pk} running on A", step=0.05)
            if store is not None:  # the chain's checkpoint, as A's notice upload leaves it
                seeded = seed_checkpoint(s3, bucket, lease.pk, blob)
            ask_b = book.place_ask(provider_id=b[0], node_id=b[1], market_slug=MARKET,
                                   price=2_900_000, gpus=1, available_until=until).order
            runner_a.start("--replay-xid", str(xid))
            made = wait(lambda lid=lease.pk: Lease.objects.filter(
                continues_id=lid, status="running").first(), 120,
                f"lease {lease.pk}'s continuation running on B", step=0.02)
            failed = Lease.objects.get(pk=lease.pk)
            waits.append((made.started_at - failed.ended_at).total_seconds())
            restored = ""
            if store is not None:
                report = wait(lambda mid=made.pk: LeaseEvent.objects.filter(
                    lease_id=mid, detail__checkpoint__reason="restore").first(), 30,
                    f"lease {made.pk}'s restore report", step=0.05)
                got = report.detail["checkpoint"]
                if (got["status"], got["key"]) != ("restored", seeded):
                    raise RuntimeError(f"lease {made.pk} restored {got}, not {seeded}")
                restored = f", {got['bytes'] >> 20} MiB restored"
            print(f"run {run + 1}: lease {failed.pk} failed ({failed.failure_code}) → lease "
                  f"{made.pk} running in {waits[-1] * 1000:.0f} ms{restored}", flush=True)
            end_lease(lease_id=made.pk, status="completed", cause="failover bench: done")
            book.cancel_order(user_id=b[0], order_id=ask_b.pk)
            wait(lambda mid=made.pk: not docker_client.api.containers(
                all=True, filters={"label": f"gpumarket.lease={mid}"}), 30,
                "runner B to remove the continuation", step=0.05)
    finally:
        for runner in runners:
            runner.stop()
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        connections.close_all()
        for node_id in (a[1], b[1]):
            uid = str(Node.objects.get(pk=node_id).uid)
            for container in docker_client.containers.list(
                    all=True, filters={"label": f"gpumarket.node={uid}"}):
                container.remove(force=True)

    ms = sorted(v * 1000 for v in waits)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, docker "
          f"{docker_client.version().get('Version')}, load average "
          f"{os.getloadavg()[0]:.1f}; {len(ms)} runs, checkpoint {args.checkpoint_mib} MiB; "
          f"failure → continuation running: "
          f"p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
