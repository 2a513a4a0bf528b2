"""Buyer CLI: how long `gpumarket wait LEASE` takes to return after the runner reports the
lease `running`, over the `/ws/me/` feed (or, with `--no-ws`, a server without websockets:
the CLI's polling), and what one plain command costs (`gpumarket wallet`, a new process).

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated), a provider
with a node (8 recorded H100s, no runner process: its reports are made over HTTP with the
node's runner token, as the runner makes them), a standing ask, a funded buyer logged in
with `gpumarket login --token -`; uvicorn (marketplace.asgi:application) on 127.0.0.1
with the Redis channel layer.

Timed, `--leases` times: a 1-GPU bid placed through the market service (it fills at
once); `gpumarket wait L --interval I` started, and once it printed its `pending` line,
the runner's `starting` and then `running` reports are POSTed: t0 is just before the
`running` POST, t1 when the wait process has exited 0. Then `--wallets` times: the wall
time of `gpumarket wallet` (process start to exit). Prints p50/p99/max.

    .venv/bin/python bench/cli_wait.py [--leases 30] [--interval 2] [--no-ws]
                                       [--redis redis://127.0.0.1:6379/7]
"""

from __future__ import annotations

import argparse
import json
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
from bench.handoff import _up, wait  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"


def set_up() -> tuple[int, str, str]:
    """Node with an ask, funded buyer → (buyer id, runner token, buyer API token)."""
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace import api_tokens, book
    from providers import services as provider_services
    from providers.runner.nvsmi import parse_dump
    from settlement import services as ledger

    User = get_user_model()
    owner = User.objects.create(username="cli-bench-provider", password="!")
    provider = provider_services.provider_onboard(user_id=owner.pk, display_name="Bench")
    created = provider_services.node_create(provider=provider, name="cli-bench-node")
    inv = parse_dump(DUMP)
    provider_services.inventory_record(
        node=created.node, hostname="cli-bench-node", driver_version=inv.driver_version,
        cuda_version=inv.cuda_version, runner_version="bench", source="simulate",
        gpus=[g.as_protocol() for g in inv.gpus])
    book.place_ask(provider_id=owner.pk, node_id=created.node.pk, market_slug=None,
                   price=1_500_000, gpus=8, available_until=timezone.now() + timedelta(days=2))
    buyer = User.objects.create(username="cli-bench-buyer", password="!")
    ledger.dev_credit(user_id=buyer.pk, amount=10**12)
    return buyer.pk, created.runner_token, api_tokens.issue(user=buyer, name="bench").key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=30)
    ap.add_argument("--wallets", type=int, default=20)
    ap.add_argument("--interval", type=float, default=2.0,
                    help="the CLI's --interval (its polls when the feed is down)")
    ap.add_argument("--no-ws", action="store_true", help="uvicorn --ws none: the CLI polls")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/7")
    ap.add_argument("--db", default="gpumarket_cli_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8393)
    args = ap.parse_args()

    env = {**server_env(fresh_database(args.pg, args.db)), "REDIS_URL": args.redis}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    buyer_id, runner_token, api_token = set_up()
    from django.db import connections

    from marketplace import book
    from marketplace.lease_end import end_lease

    connections.close_all()
    base = f"http://127.0.0.1:{args.port}"
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    cli_env["GPUMARKET_CONFIG"] = str(Path(tempfile.mkdtemp(prefix="cli-bench-")) / "c.json")
    gm = [sys.executable, "-m", "buyer_cli"]
    runner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {runner_token}"})
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host", "127.0.0.1",
         "--port", str(args.port), "--no-access-log", "--log-level", "warning",
         *(["--ws", "none"] if args.no_ws else [])], cwd=ROOT, env=env)
    to_exit, wallets = [], []
    try:
        wait(lambda: _up(base), 30, "uvicorn", step=0.1)
        subprocess.run([*gm, "login", "--url", base, "--token", "-"], input=api_token + "\n",
                       text=True, env=cli_env, cwd=ROOT, check=True, capture_output=True)
        for _ in range(args.leases):
            [lease] = book.place_bid(buyer_id=buyer_id, market_slug="h100-sxm-80gb",
                                     price=2_000_000, gpus=1, duration_seconds=3600,
                                     image="gpumarket/busybox:local").leases
            waiting = subprocess.Popen([*gm, "wait", str(lease.pk), "--interval",
                                        str(args.interval)], cwd=ROOT, env=cli_env,
                                       stdout=subprocess.PIPE, text=True)
            line = waiting.stdout.readline()
            assert "pending" in line, line
            events = f"/api/v1/runner/leases/{lease.pk}/events/"
            runner.post(events, json={"status": "starting"}).raise_for_status()
            t0 = time.perf_counter()
            runner.post(events, json={"status": "running", "container_id": "bench"}) \
                .raise_for_status()
            assert waiting.wait(timeout=60) == 0
            to_exit.append(time.perf_counter() - t0)
            waiting.stdout.close()
            end_lease(lease_id=lease.pk, status="completed", cause="cli bench: done")
        for _ in range(args.wallets):
            t0 = time.perf_counter()
            done = subprocess.run([*gm, "wallet", "--json"], cwd=ROOT, env=cli_env,
                                  capture_output=True, text=True, check=True)
            wallets.append(time.perf_counter() - t0)
            json.loads(done.stdout)
    finally:
        server.terminate()
        server.wait(timeout=30)
        runner.close()
        connections.close_all()

    how = f"no websockets (CLI polls every {args.interval:g} s)" if args.no_ws else "feed on"
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; {how}; "
          f"{args.leases} leases, {args.wallets} wallet calls")
    for name, values in (("runner reports running → `gpumarket wait` exits", to_exit),
                         ("`gpumarket wallet` (new process, one GET)", wallets)):
        ms = sorted(v * 1000 for v in values)
        print(f"{name}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, "
              f"max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
