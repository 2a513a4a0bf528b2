"""Lease running → first SSH login accepted, and → Jupyter answering: how long from the
runner reporting a lease `running` (its endpoints reported) until a real SSH client logs
in to it with the buyer's key and runs a command, and until JupyterLab answers with the
lease's token, with the local images cached (issue 12's target: under 2 s).

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
is then ended and the next one starts once its container is gone. Then `--jupyter-leases`
times (default: as many): a bid of the `pytorch-jupyter` template with the local image
gpumarket/jupyter:local (scripts/build-jupyter-image.sh, cached) running the template's
command (sshd, then JupyterLab); t_running when the lease is `running` with its Jupyter
link (`connect.jupyter`), then GET /api/status?token=… every 10 ms until JupyterLab
answers 200. JupyterLab's start is CPU work: the runner gives a 1-GPU lease
`--cpus-per-gpu` CPUs (default: this machine's count, as on a real 8-GPU host; the
runner's own 1/8-of-the-host rule would give 0.25 CPU on 2). Prints p50/p99/max of
running → login/answer and of match → login/answer.

    .venv/bin/python bench/connect.py [--leases 30] [--jupyter-leases N] [--cpus-per-gpu N]
                                      [--redis redis://127.0.0.1:6379/7]
                                      [--db gpumarket_connect] [--port 8393]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env  # noqa: E402
from bench.handoff import DUMP, _up, set_up, wait  # noqa: E402
from tests.support.ssh import SSH_IMAGE, key_pair, ssh_login  # noqa: E402

JUPYTER_IMAGE = "gpumarket/jupyter:local"  # scripts/build-jupyter-image.sh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--jupyter-leases", type=int, default=None,
                    help="leases of the pytorch-jupyter template (default: --leases)")
    ap.add_argument("--cpus-per-gpu", default=str(os.cpu_count() or 1),
                    help="the runner's --cpus-per-gpu (default: this machine's CPU count, "
                         "as a real 8-GPU host has 8× that; 'share': the runner's own "
                         "rule, 1/8 of this machine per GPU)")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_connect")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8393)
    args = ap.parse_args()
    if args.jupyter_leases is None:
        args.jupyter_leases = args.leases

    import docker

    docker_client = docker.from_env(timeout=30)
    docker_client.images.get(SSH_IMAGE)  # scripts/build-ssh-image.sh: cached, no pull
    if args.jupyter_leases:
        docker_client.images.get(JUPYTER_IMAGE)  # scripts/build-jupyter-image.sh
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
    from marketplace.env_templates import resolve
    from marketplace.jupyter import jupyter_link
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
    to_login, match_to_login, to_jupyter, match_to_jupyter = [], [], [], []
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
             network.name, "--public-host", "127.0.0.1", "--grace", "1",
             *([] if args.cpus_per_gpu == "share" else ["--cpus-per-gpu", args.cpus_per_gpu])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: "connected;" in (Path(state) / "runner.log").read_text(), 30,
             "the runner's push websocket", step=0.05)
        node = Node.objects.get(pk=node_id)
        book.place_ask(provider_id=provider_id, node_id=node_id, market_slug=None,
                       price=2_490_000, gpus=Gpu.objects.filter(node=node).count(),
                       available_until=timezone.now() + timedelta(days=2))
        label = f"gpumarket.node={node.uid}"

        def one_lease(terms, ready, answered):
            """(running → answered, match → answered) in seconds for one lease."""
            [lease] = book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb",
                                     price=2_490_000, gpus=1, duration_seconds=3600,
                                     **terms).leases
            t0 = time.perf_counter()

            def running(lid=lease.pk):
                row = Lease.objects.filter(pk=lid, status="running").first()
                return row and ready(row)

            found = wait(running, 30, f"lease {lease.pk} running with its endpoint")
            t_running = time.perf_counter()
            wait(lambda: answered(found), 60, f"lease {lease.pk} answering", step=0.01)
            t_done = time.perf_counter()
            end_lease(lease_id=lease.pk, status="completed", cause="connect bench: done")
            wait(lambda lid=lease.pk: not docker_client.api.containers(
                all=True, filters={"label": [label, f"gpumarket.lease={lid}"]}),
                30, f"the runner to remove lease {lease.pk}'s container", step=0.02)
            return t_done - t_running, t_done - t0

        ssh_terms = {"image": SSH_IMAGE, "ssh": True}
        for _ in range(args.leases):
            a, b = one_lease(ssh_terms, ssh_endpoint,
                             lambda e: ssh_login(e["host_port"], pair))
            to_login.append(a)
            match_to_login.append(b)
        # the template's own command (sshd, then JupyterLab), its image the local one and
        # the simulated driver's CUDA 12.2 (a bid with its own image may go lower)
        jupyter_terms = resolve(template="pytorch-jupyter", image=JUPYTER_IMAGE,
                                min_cuda="12.2")
        for _ in range(args.jupyter_leases):
            a, b = one_lease(jupyter_terms, jupyter_link, jupyter_answers)
            to_jupyter.append(a)
            match_to_jupyter.append(b)
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
          f"{docker_client.version().get('Version')}; images {SSH_IMAGE}, {JUPYTER_IMAGE}; "
          f"{len(to_login)} leases with ssh, {len(to_jupyter)} with Jupyter; "
          f"--cpus-per-gpu {args.cpus_per_gpu}")
    for name, values in (("lease running → first SSH login accepted", to_login),
                         ("match → first SSH login accepted", match_to_login),
                         ("lease running → Jupyter answering", to_jupyter),
                         ("match → Jupyter answering", match_to_jupyter)):
        if not values:
            continue
        ms = sorted(v * 1000 for v in values)
        print(f"{name}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, "
              f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")


def jupyter_answers(link: str) -> bool:
    """Whether JupyterLab behind the lease's link answers 200 at /api/status with the
    link's token (what a browser's first call after opening the link gets). Plain
    http.client: a poll every 10 ms must not take the CPU JupyterLab starts on."""
    parts = urlsplit(link)
    token = parse_qs(parts.query)["token"][0]
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
    try:
        conn.request("GET", f"/api/status?token={token}")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()

if __name__ == "__main__":
    main()
