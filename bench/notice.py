"""Notice → workload: how long from the marketplace giving a running lease a notice until
its workload's handler has run, and from the lease's end until its container is gone
(docs/LEASE_CONTRACT.md).

Setup (not timed): bench/handoff.py's — a fresh PostgreSQL database (dropped, created,
migrated), uvicorn with the Redis channel layer (push notices cross processes through it),
the real runner (`python -m providers.runner run --simulate <8×H100> --runtime docker
--network none`, push on, `--poll-interval`), a standing ask for the node's 8 GPUs.

Timed, `--leases` times: a 1-GPU bid with `notice_signal: SIGUSR1` whose busybox workload
prints `notice-seen` in its SIGUSR1 trap and exits 0 on SIGTERM; once the lease is
`running`, t0 = the commit of a notice (lease_notice.give_notice, deadline 60 s ahead, in
its own transaction, as the maintenance sweep gives it); t1 = the container's log shows
`notice-seen` (polled every 5 ms): the runner got the push, fetched the list, wrote
/run/gpumarket/notice and sent the signal. Then t2 = the lease ended (`preempted`, as at the
deadline), t3 = the Docker API has no container of it any more (notice, SIGTERM, the
workload exits, removal). Prints p50/p99/max of t1−t0 and t3−t2.

    .venv/bin/python bench/notice.py [--leases 30] [--poll-interval 2]
                                     [--redis redis://127.0.0.1:6379/7] [--db D] [--port P]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402
from bench.handoff import DUMP, IMAGE, _up, set_up, wait  # noqa: E402

WORKLOAD = ("trap 'echo notice-seen' USR1; trap 'exit 0' TERM; echo ready; "
            "while :; do sleep 0.05; done")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_notice_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8393)
    args = ap.parse_args()

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(IMAGE)

    database_url = fresh_database(args.pg, args.db)
    env = {**server_env(database_url), "REDIS_URL": args.redis}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    provider_id, node_id, buyer_id, token = set_up()

    from datetime import timedelta

    from django.db import connections, transaction
    from django.utils import timezone

    from marketplace import book, lease_notice
    from marketplace.lease_end import end_lease
    from marketplace.models import Lease
    from providers.models import Gpu, Node

    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    state = tempfile.mkdtemp(prefix="notice-runner-")
    procs, node = [], None
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
             "--poll-interval", str(args.poll_interval)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: Node.objects.filter(pk=node_id, last_heartbeat_at__isnull=False).exists(),
             30, "the runner's first heartbeat", step=0.05)
        wait(lambda: "connected;" in (Path(state) / "runner.log").read_text(), 30,
             "the runner's push websocket", step=0.05)
        node = Node.objects.get(pk=node_id)
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=Gpu.objects.filter(node=node).count(),
                       available_until=timezone.now() + timedelta(days=2))
        label = f"gpumarket.node={node.uid}"

        to_workload, to_gone = [], []
        for _ in range(args.leases):
            [lease] = book.place_bid(
                buyer_id=buyer_id, market_slug="h100-sxm-80gb", price=2_490_000, gpus=1,
                duration_seconds=3600, image=IMAGE, command=["sh", "-c", WORKLOAD],
                notice_signal="SIGUSR1", stop_grace_seconds=5).leases
            wait(lambda lid=lease.pk: Lease.objects.filter(pk=lid, status="running").exists(),
                 30, f"lease {lease.pk} running", step=0.01)
            [container] = docker_client.containers.list(
                filters={"label": [label, f"gpumarket.lease={lease.pk}"]})
            wait(lambda c=container: b"ready" in c.logs(), 10, "the workload", step=0.01)
            with transaction.atomic():
                locked = Lease.objects.select_for_update().get(pk=lease.pk)
                now = timezone.now()
                lease_notice.give_notice(locked, reason=lease_notice.MAINTENANCE,
                                         deadline=now + timedelta(seconds=60), now=now,
                                         cause="notice bench")
            t0 = time.perf_counter()
            wait(lambda c=container: b"notice-seen" in c.logs(), 30, "the handler")
            to_workload.append(time.perf_counter() - t0)
            t2 = time.perf_counter()
            end_lease(lease_id=lease.pk, status="preempted", cause="notice bench: deadline")
            wait(lambda lid=lease.pk: not docker_client.api.containers(
                all=True, filters={"label": [label, f"gpumarket.lease={lid}"]}),
                30, f"the runner to remove lease {lease.pk}'s container")
            to_gone.append(time.perf_counter() - t2)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        connections.close_all()
        for container in docker_client.containers.list(
                all=True, filters={"label": "gpumarket.lease"}):
            if container.labels.get("gpumarket.node") == str(getattr(node, "uid", "")):
                container.remove(force=True)

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}, docker {docker_client.version().get('Version')}; "
          f"image {IMAGE}; runner poll interval {args.poll_interval:g} s, push on; "
          f"{args.leases} leases of 1 GPU")
    for name, values in (("notice committed → workload's SIGUSR1 handler ran", to_workload),
                         ("lease ended → container gone (SIGTERM handled)", to_gone)):
        ms = sorted(v * 1000 for v in values)
        print(f"{name}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, "
              f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
