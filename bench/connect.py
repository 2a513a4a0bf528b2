"""Lease running → first SSH login accepted: how long from the runner reporting a lease
`running` (its endpoints reported) until a real SSH client logs in to it with the buyer's
key and runs a command, with the local sshd image cached (issue 12's target: under 2 s).

Setup (not timed), as bench/handoff.py: a fresh PostgreSQL database, uvicorn
(marketplace.asgi) on 127.0.0.1 with the Redis channel layer (push notices), the real
runner (`python -m providers.runner run --simulate <8×H100 dump> --runtime docker`) on a
user-defined bridge network this bench creates (`--network`, removed at the end) with
`--public-host 127.0.0.1`, a standing ask for the node's 8 GPUs, and one funded buyer with
one ed25519 key on the account.

Timed, `--leases` times: a 1-GPU bid with `ssh` (image gpumarket/sshd:local, its own
entrypoint) placed through the market service (t0: the lease committed `pending`); polling
every 5 ms, t_running when the lease is `running` with its SSH endpoint (the command in
`connect.ssh`); then paramiko (tests/support/ssh.py: connect, key exchange, public-key
auth as root, `echo`) is tried on the published port until it gets in: t_login. The lease
is then ended and the next one starts once its container is gone. Prints p50/p99/max of
running → login and of match → login.

    .venv/bin/python bench/connect.py [--leases 30] [--redis redis://127.0.0.1:6379/7]
                                      [--db gpumarket_connect] [--port 8393]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402
from bench.handoff import DUMP, _up, set_up, wait  # noqa: E402
from tests.support.ssh import SSH_IMAGE, key_pair, ssh_login  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_connect")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8393)
    args = ap.parse_args()

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(SSH_IMAGE)  # scripts/build-ssh-image.sh: cached, no pull
    network = docker_client.networks.create(f"gpumarket-bench-{uuid.uuid4().hex[:8]}",
                                            driver="bridge")

    database_url = fresh_database(args.pg, args.db)
    env = {**server_env(database_url), "REDIS_URL": args.redis}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    provider_id, node_id, buyer_id, token = set_up()

    from datetime import timedelta

    from django.db import connections
    from django.utils import timezone

    from marketplace import book, ssh_keys
    from marketplace.lease_end import end_lease
    from marketplace.models import Lease
    from marketplace.ports import ssh_endpoint
    from providers.models import Gpu, Node

    pair = key_pair()
    ssh_keys.add_key(owner_id=buyer_id, public_key=pair.public_line, name="bench")
    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    state = tempfile.mkdtemp(prefix="connect-runner-")
    procs = []
    node = None
    to_login, match_to_login = [], []
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
            [*runner, "run", "--state-dir", state, "--runtime", "docker", "--network",
             network.name, "--public-host", "127.0.0.1", "--grace", "1"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: "connected;" in (Path(state) / "runner.log").read_text(), 30,
             "the runner's push websocket", step=0.05)
        node = Node.objects.get(pk=node_id)
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=Gpu.objects.filter(node=node).count(),
                       available_until=timezone.now() + timedelta(days=2))
        label = f"gpumarket.node={node.uid}"

        for _ in range(args.leases):
            [lease] = book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb",
                                     price=2_490_000, gpus=1, duration_seconds=3600,
                                     image=SSH_IMAGE, ssh=True).leases
            t0 = time.perf_counter()

            def running(lid=lease.pk):
                row = Lease.objects.filter(pk=lid, status="running").first()
                return row and ssh_endpoint(row)

            endpoint = wait(running, 30, f"lease {lease.pk} running with its SSH endpoint")
            t_running = time.perf_counter()
            wait(lambda p=endpoint["host_port"]: ssh_login(p, pair), 30,
                 f"the first SSH login to lease {lease.pk}", step=0.01)
            t_login = time.perf_counter()
            to_login.append(t_login - t_running)
            match_to_login.append(t_login - t0)
            end_lease(lease_id=lease.pk, status="completed", cause="connect bench: done")
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
        network.remove()

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, docker "
          f"{docker_client.version().get('Version')}; image {SSH_IMAGE}; "
          f"{len(to_login)} leases with ssh")
    for name, values in (("lease running → first SSH login accepted", to_login),
                         ("match → first SSH login accepted", match_to_login)):
        ms = sorted(v * 1000 for v in values)
        print(f"{name}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, "
              f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
