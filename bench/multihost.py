"""Bid throughput with the web processes on separate hosts: 1, 2 and 4 markets with 1 and
2 web processes, each web process (uvicorn, one worker) in a network-namespace host of
its own (tests/support/netns.py), PostgreSQL and Redis reached through proxies on the
bridge address, the load generator in the root namespace.

Setup (not timed): a fresh database, migrated; funded buyers; no asks, so every bid
rests (the bid path: hold, market lock, book, commit, feed). Per configuration
`--concurrency` raw HTTP/1.1 keep-alive clients (api_orders.RawClient), client k
posting 1–2 GPU, 1 hour bids priced around 2.30 to market k mod M through web process
k mod W for `--seconds`. Prints bids/s, p50/p99.

Run (root, iproute2, socat): .venv/bin/python bench/multihost.py [--seconds 15]
          [--concurrency 24] [--db gpumarket_bench_multihost]
          [--pg postgres://postgres@127.0.0.1:5432] [--redis redis://127.0.0.1:6379/13]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import api_orders  # noqa: E402

from tests.support.netns import Hosts  # noqa: E402

WEB = ["web-a", "web-b"]


async def drive(urls: list[str], markets: list[str], tokens: list[str], *, concurrency: int,
                seconds: float, seed: int) -> tuple[list[float], Counter, float]:
    rng = random.Random(seed)
    latencies: list[float] = []
    codes: Counter = Counter()
    deadline = time.monotonic() + seconds

    async def client_loop(k: int) -> None:
        host, port = urls[k % len(urls)].removeprefix("http://").split(":")
        client = api_orders.RawClient(host, int(port), tokens[k % len(tokens)])
        market = markets[k % len(markets)]
        try:
            while time.monotonic() < deadline:
                body = {"side": "bid", "gpu_class": market, "gpus": rng.choice((1, 2)),
                        "hours": 1,
                        "price": f"{max(0.01, round(rng.gauss(2.30, 0.10), 2)):.2f}"}
                t0 = time.perf_counter()
                status, _answer = await client.post("/api/v1/orders/", body)
                latencies.append(time.perf_counter() - t0)
                codes[status] += 1
        finally:
            await client.close()

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(k) for k in range(concurrency)))
    return latencies, codes, time.perf_counter() - start


def funded_buyers(n: int) -> list[str]:
    """`n` buyers with a large wallet and an API token each (their tokens)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from marketplace import api_tokens
    from settlement import services as ledger

    tokens = []
    for i in range(n):
        user = get_user_model().objects.create(username=f"bench-buyer-{i}", password="!")
        ledger.dev_credit(user_id=user.pk, amount=10**12)
        tokens.append(api_tokens.issue(user=user, name="bench").key)
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--buyers", type=int, default=48)
    ap.add_argument("--db", default="gpumarket_bench_multihost")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    database_url = api_orders.fresh_database(args.pg, args.db)
    env = {**api_orders.server_env(database_url), "REDIS_URL": args.redis,
           "GPUMARKET_DB_POOL_MAX": "4"}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    tokens = funded_buyers(args.buyers)
    from django.db import connections

    from marketplace.models import GpuClass

    markets = ["h100-sxm-80gb", *GpuClass.objects.exclude(slug="h100-sxm-80gb")
               .order_by("slug").values_list("slug", flat=True)[:3]]
    connections.close_all()

    pg_port = int(args.pg.rsplit(":", 1)[1])
    redis_port, redis_db = args.redis.rsplit(":", 1)[1].split("/")
    work = Path(tempfile.mkdtemp(prefix="gpumarket-bench-multihost-"))
    with Hosts(WEB) as hosts:
        pg, redis = hosts.expose(pg_port), hosts.expose(int(redis_port))
        host_env = {**env, "DATABASE_URL": f"postgres://postgres@{hosts.gateway}:{pg}/{args.db}",
                    "REDIS_URL": f"redis://{hosts.gateway}:{redis}/{redis_db}",
                    "ALLOWED_HOSTS": ",".join(hosts.address.values())}
        urls = []
        for name in WEB:
            (work / name).mkdir()
            hosts.run(name, [sys.executable, "-m", "uvicorn", "marketplace.asgi:application",
                             "--host", hosts.address[name], "--port", "8000",
                             "--no-access-log", "--log-level", "warning"],
                      env={**host_env, "GPUMARKET_VAR_DIR": str(work / name),
                           "PROMETHEUS_MULTIPROC_DIR": str(work / name)},
                      cwd=ROOT, log=work / f"{name}.log")
            urls.append(f"http://{hosts.address[name]}:8000")
        for url in urls:
            asyncio.run(api_orders.wait_until_up(url, timeout=60))
        print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; "
              f"clients {args.concurrency}, {args.seconds:.0f} s per configuration")
        for n_markets in (1, 2, 4):
            for n_webs in (1, 2):
                latencies, codes, elapsed = asyncio.run(drive(
                    urls[:n_webs], markets[:n_markets], tokens, concurrency=args.concurrency,
                    seconds=args.seconds, seed=args.seed))
                ms = sorted(x * 1000 for x in latencies)
                ok = codes.get(201, 0)
                print(f"markets {n_markets}, web processes {n_webs}: {ok / elapsed:,.0f} "
                      f"bids/s; p50 {api_orders.pct(ms, 50):.1f} ms, "
                      f"p99 {api_orders.pct(ms, 99):.1f} ms; status "
                      f"{dict(sorted(codes.items()))}; load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
