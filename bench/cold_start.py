"""Match → lease running with a cached image vs a cold pull from a local registry
(DESIGN.md target: under 2 s with a cached image; cold pulls measured, never billed).

Setup (not timed): as bench/handoff.py — a fresh PostgreSQL database, uvicorn on
127.0.0.1 with the Redis channel layer (runner push notices), the real runner
(`python -m providers.runner run --runtime docker --network none --no-prefetch`) on the 8
recorded H100s, a standing ask of the node's 8 GPUs — plus Debian's docker-registry on
127.0.0.1:`--registry-port` (tests/support/registry.py) holding, per `--sizes` entry, an
image of that many MiB of random bytes (incompressible: every byte is pulled) in layers of
`--layer-mib` MiB, written through the registry's HTTP API (`--push api`, the default:
tests/support/registry.push_random) or built by `docker import` + `docker build` and
pushed (`--push docker`; push time printed)
and removed from the local engine.

Timed, per size: a bid for 1 GPU with that image (t0: the lease committed `pending`);
t_lease when the runner has reported it `running` (the lease clock starts there). The
pull time is the runner's own ("image … pulled in X s", its last progress event). Then
`--warm` more leases of the same image, now in the runner's cache. Each lease is ended
and its container removed before the next. At the end the images are removed from the
engine and the registry's storage is deleted.

    .venv/bin/python bench/cold_start.py [--sizes 256,1024,5120] [--layer-mib 256] [--push api]
        [--warm 5] [--registry-port 24500] [--port 24501] [--redis redis://127.0.0.1:6379/7]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402
from bench.handoff import DUMP, _up, set_up, wait  # noqa: E402
from tests.support import registry as reg  # noqa: E402


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1024,5120", help="MiB per image, comma-separated")
    ap.add_argument("--layer-mib", type=int, default=256)
    ap.add_argument("--push", choices=("api", "docker"), default="api",
                    help="api: write the image through the registry's HTTP API (fast); "
                         "docker: docker build + docker push (~4 MiB/s here)")
    ap.add_argument("--warm", type=int, default=5, help="cached starts per image")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_cold_start")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=24501)
    ap.add_argument("--registry-port", type=int, default=24500)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    import docker

    docker_client = docker.from_env(timeout=600)
    registry = reg.start(args.registry_port)
    refs: list[str] = []
    built: list[tuple[int, str, float, float]] = []  # (MiB, ref, build s, push s)
    try:
        for mib in sizes:
            ref = registry.ref(f"bench/cold-{mib}", "1")
            layers = max(1, mib // args.layer_mib)
            t = time.perf_counter()
            if args.push == "docker":
                reg.build_image(ref, mib, layers)
                t_build = time.perf_counter() - t
                t = time.perf_counter()
                subprocess.run(["docker", "push", ref], check=True, stdout=subprocess.DEVNULL)
            else:  # written through the registry's API (built and pushed in one)
                reg.push_random(registry, f"bench/cold-{mib}", mib, layers)
                t_build = 0.0
            t_push = time.perf_counter() - t
            reg.remove_local(ref)
            refs.append(ref)
            built.append((mib, ref, t_build, t_push))
            print(f"built {ref}: {mib} MiB in {layers} layers ({t_build:.1f} s), pushed in "
                  f"{t_push:.1f} s", flush=True)
        rows = run_market(args, docker_client, built)
    finally:
        for ref in refs:
            reg.remove_local(ref)
        registry.stop()

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, docker "
          f"{docker_client.version().get('Version')}, docker-registry on 127.0.0.1; "
          f"layers of {args.layer_mib} MiB; warm starts per image {args.warm}")
    print("| image | cold: match → running | runner's pull | pull rate | warm: match → "
          "running p50 / max | load before → after |")
    for mib, cold, pull, warm, load in rows:
        ms = sorted(w * 1000 for w in warm)
        warm_text = f"{pct(ms, 50):.0f} ms / {ms[-1]:.0f} ms" if ms else "—"
        print(f"| {mib} MiB | {cold:.1f} s | {pull:.1f} s | {mib / pull:.0f} MiB/s | "
              f"{warm_text} | {load} |")


def run_market(args, docker_client, built) -> list[tuple]:
    database_url = fresh_database(args.pg, args.db)
    env = {**server_env(database_url), "REDIS_URL": args.redis,
           "GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY": "1"}  # the registry is on 127.0.0.1
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
    from providers.models import Node

    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    state = tempfile.mkdtemp(prefix="cold-start-runner-")
    procs, rows = [], []
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
        log_path = Path(state) / "runner.log"
        log = open(log_path, "w")  # noqa: SIM115 - closed with the runner
        procs.append(subprocess.Popen(
            [*runner, "run", "--state-dir", state, "--runtime", "docker", "--network", "none",
             "--grace", "1", "--no-prefetch", "--allow-private-registry"], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: Node.objects.filter(pk=node_id, last_heartbeat_at__isnull=False).exists(),
             30, "the runner's first heartbeat", step=0.05)
        wait(lambda: "connected;" in log_path.read_text(), 30, "the push websocket", step=0.05)
        node = Node.objects.get(pk=node_id)
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=8, available_until=timezone.now() + timedelta(days=2))
        label = f"gpumarket.node={node.uid}"

        def one(image: str) -> tuple[float, Lease]:
            placed = book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb",
                                    price=2_490_000, gpus=1, duration_seconds=3600,
                                    image=image, command=["sleep", "3600"])
            t0 = time.perf_counter()
            [lease] = placed.leases
            wait(lambda: Lease.objects.filter(pk=lease.pk, status="running").exists(), 1800,
                 f"lease {lease.pk} to run (see {log_path})", step=0.005)
            took = time.perf_counter() - t0
            lease.refresh_from_db()
            end_lease(lease_id=lease.pk, status="completed", cause="cold-start bench: done")
            wait(lambda lid=lease.pk: not docker_client.api.containers(
                all=True, filters={"label": [label, f"gpumarket.lease={lid}"]}),
                60, f"lease {lease.pk}'s container to go", step=0.02)
            return took, lease

        for mib, ref, _b, _p in built:
            before = loadavg()
            cold, lease = one(ref)
            said = re.search(r"pulled in ([0-9.]+) s", lease.progress or "")
            pull = float(said.group(1)) if said else float("nan")
            warm = [one(ref)[0] for _ in range(args.warm)]
            rows.append((mib, cold, pull, warm, f"{before} → {loadavg()}"))
            print(f"{mib} MiB: cold {cold:.1f} s (pull {pull:.1f} s), warm "
                  f"{', '.join(f'{w * 1000:.0f} ms' for w in warm)}", flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        connections.close_all()
        for container in docker_client.containers.list(
                all=True, filters={"label": "gpumarket.lease"}):
            if container.labels.get("gpumarket.node") == str(getattr(node, "uid", "")):
                container.remove(force=True)
    return rows


if __name__ == "__main__":
    main()
