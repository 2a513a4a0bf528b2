"""Order placement through the HTTP API: concurrent clients against a running ASGI
server (uvicorn, marketplace.asgi:application) on 127.0.0.1 with PostgreSQL.

Setup (not timed): a fresh database (dropped and created, then migrated), one
provider whose node has 8 H100s offered by a standing ask at 2.49 USD/GPU-hour, and
`--buyers` funded buyers with API tokens. Then `--concurrency` asyncio clients (a
minimal HTTP/1.1 keep-alive client each, one connection; --httpx for httpx) POST bids
to /api/v1/orders/ — 1–2 GPUs, 1 hour, prices seeded normal around 2.30 (sigma 0.10,
0.01 tick), so a few cross the ask and most rest — until `--orders` bids are answered
or `--seconds` pass. Prints orders/s over the whole run,
p50/p99 latency of each request, and the status codes.

The server runs with DEBUG off and no access log; it shares the machine's cores with
PostgreSQL and with this client. The DESIGN.md target is >= 500 orders/s with p99 <
100 ms on a 2-core machine.

Run:  .venv/bin/python bench/api_orders.py [--orders 4000] [--concurrency 24]
          [--workers 1] [--httpx] [--buyers 50] [--seconds 60] [--db gpumarket_bench]
          [--pg postgres://postgres@127.0.0.1:5432] [--port 8391] [--seed 1]
          [--resting N] [--reuse]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psycopg
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


#: The COMMENT a bench puts on each database it creates; a bench drops only databases
#: that carry it, so `--db gpumarket` can never drop a real one.
BENCH_DATABASE_COMMENT = "gpumarket bench database: dropped and re-created by bench/"


def drop_bench_database(conn, name: str) -> None:
    """DROP DATABASE name (autocommit `conn` to the maintenance database), only if absent or
    marked by mark_bench_database; else SystemExit naming it."""
    row = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                       "WHERE datname = %s", [name]).fetchone()
    if row is None:
        return
    if row[0] != BENCH_DATABASE_COMMENT:
        raise SystemExit(f"bench: database {name!r} exists and was not created by a bench; "
                         "not dropping it (name another with --db)")
    conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def mark_bench_database(conn, name: str) -> None:
    conn.execute(f'COMMENT ON DATABASE "{name}" IS \'{BENCH_DATABASE_COMMENT}\'')


def fresh_database(pg: str, name: str) -> str:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        drop_bench_database(conn, name)
        conn.execute(f'CREATE DATABASE "{name}"')
        mark_bench_database(conn, name)
    return f"{pg}/{name}"


BENCH_SECRETS_KEY = Fernet.generate_key().decode()  # one per run, for every process


def server_env(database_url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": database_url, "DEBUG": "0",
            "SECRET_KEY": "bench-only-not-a-secret", "LOG_LEVEL": "WARNING",
            "GPUMARKET_SECRETS_KEY": BENCH_SECRETS_KEY,
            "GPUMARKET_SSL_REDIRECT": "0",  # plain http on 127.0.0.1
            "GPUMARKET_METRICS_ALLOW": "127.0.0.1/32",  # the report reads /metrics
            "DJANGO_SETTINGS_MODULE": "marketplace.settings"}


def set_up_market(n_buyers: int, resting: int = 0, seed: int = 1) -> list[str]:
    """Provider, node with 8 H100s (heartbeating), a standing ask; funded buyers; then
    `resting` bids resting below the ask (book.place_bids, in groups). Returns the
    buyers' tokens."""
    from datetime import timedelta

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace import api_tokens, book
    from providers import services as provider_services
    from providers.runner.nvsmi import parse_dump
    from settlement import services as ledger

    User = get_user_model()
    dump = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
    owner = User.objects.create(username="bench-provider", password="!")
    provider = provider_services.provider_onboard(user_id=owner.pk, display_name="Bench")
    node = provider_services.node_create(provider=provider, name="bench-node").node
    inv = parse_dump(dump)
    provider_services.inventory_record(
        node=node, hostname="bench-node", driver_version=inv.driver_version,
        cuda_version=inv.cuda_version, runner_version="bench", source="simulate",
        gpus=[g.as_protocol() for g in inv.gpus])
    provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])  # asks need it
    book.place_ask(provider_id=owner.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=timezone.now() + timedelta(days=2))
    tokens = []
    for i in range(n_buyers):
        user = User.objects.create(username=f"bench-buyer-{i}", password="!")
        ledger.dev_credit(user_id=user.pk, amount=10**12)
        tokens.append(api_tokens.issue(user=user, name="bench").key)
    buyers = list(User.objects.filter(username__startswith="bench-buyer-")
                  .order_by("pk").values_list("pk", flat=True))
    place_resting(resting, buyers, seed)
    return tokens


def place_resting(n: int, buyer_ids: list[int], seed: int, group: int = 2000) -> None:
    """`n` GTC bids (1–2 GPUs, 1 hour) resting below the ask: prices seeded normal around
    2.10 (sigma 0.15), at most 2.48 — through book.place_bids, each with its hold, its
    journal entry and its event, `group` bids per transaction."""
    if n <= 0:
        return
    from marketplace import book

    rng = random.Random(seed + 1000)
    t0 = time.perf_counter()
    for start in range(0, n, group):
        requests = [book.BidRequest(
            buyer_id=buyer_ids[i % len(buyer_ids)], market_slug="h100-sxm-80gb",
            price=min(248, max(1, round(rng.gauss(2.10, 0.15) * 100))) * 10_000,
            gpus=rng.choice((1, 2)), duration_seconds=3600)
            for i in range(start, min(n, start + group))]
        for r in book.place_bids(requests):
            if isinstance(r, Exception):
                raise SystemExit(f"a resting bid was refused: {r!r}")
    print(f"{n:,} resting bids placed in {time.perf_counter() - t0:.1f} s", flush=True)


def database_ready(pg: str, name: str) -> bool:
    """Whether database `name` exists with the bench's provider (an earlier run's set-up)."""
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() \
                is None:
            return False
    with psycopg.connect(f"{pg}/{name}", autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM auth_user WHERE username = 'bench-provider'") \
            .fetchone() is not None


def reuse_market() -> list[str]:
    """A new API token for each buyer of an earlier set-up (keys are shown once)."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from marketplace import api_tokens

    users = get_user_model().objects.filter(username__startswith="bench-buyer-").order_by("pk")
    return [api_tokens.issue(user=u, name="bench").key for u in users]


def vacuum(pg: str, name: str) -> None:
    """VACUUM ANALYZE before the run: the set-up's rows are not autovacuumed during it."""
    with psycopg.connect(f"{pg}/{name}", autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def resting_count() -> int:
    from marketplace.models import Order

    return Order.objects.filter(side="bid", status__in=Order.ACTIVE).count()


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (Linux /proc), seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_pids(pid: int) -> list[int]:
    """The uvicorn process and its workers."""
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and _ppid(int(p.name)) == pid]
    return [pid, *children]


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def backend_pids(pg: str, db: str) -> list[int]:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [db])]


def scrape(base: str) -> dict[str, float]:
    """The server's book loads and bid groups from /metrics (summed over labels)."""
    wanted = ("gpumarket_book_loads_total", "gpumarket_bid_group_size_sum",
              "gpumarket_bid_group_size_count")
    found: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        for name in wanted:
            if line.startswith(name):
                key = name if "{" not in line else line.split(" ")[0]
                found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


async def wait_until_up(base: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                r = await client.get(f"{base}/api/v1/gpu-classes/")
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("the server did not come up")


class RawClient:
    """A minimal HTTP/1.1 keep-alive client on one connection (asyncio streams): writes a
    pre-encoded POST, reads the status line, the headers and Content-Length bytes of
    body, and checks the body is JSON. A tenth of httpx's CPU per request, so the
    machine's two cores go to the server and PostgreSQL, not to the load generator."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port, self.token = host, port, token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> tuple[int, dict]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: Token {self.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(int(line.split(":", 1)[1]) for line in lines[1:]
                      if line.lower().startswith("content-length:"))
        return status, json.loads(await self.reader.readexactly(length))

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def drive(base: str, tokens: list[str], *, orders: int, concurrency: int,
                seconds: float, seed: int, use_httpx: bool = False
                ) -> tuple[list[float], Counter, float]:
    rng = random.Random(seed)
    bodies = [{"side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": rng.choice((1, 2)),
               "hours": 1,
               "price": f"{max(0.01, round(rng.gauss(2.30, 0.10), 2)):.2f}"}
              for _ in range(orders)]
    latencies: list[float] = []
    codes: Counter = Counter()
    next_index = 0
    deadline = time.monotonic() + seconds
    host, port = base.removeprefix("http://").split(":")

    async def client_loop(k: int) -> None:
        nonlocal next_index
        token = tokens[k % len(tokens)]
        if use_httpx:
            client = httpx.AsyncClient(base_url=base, timeout=30,
                                       headers={"Authorization": f"Token {token}"},
                                       limits=httpx.Limits(max_connections=1))
        else:
            client = RawClient(host, int(port), token)
        try:
            while next_index < orders and time.monotonic() < deadline:
                body = bodies[next_index]
                next_index += 1
                t0 = time.perf_counter()
                if use_httpx:
                    r = await client.post("/api/v1/orders/", json=body)
                    status, answer = r.status_code, r.json()
                else:
                    status, answer = await client.post("/api/v1/orders/", body)
                latencies.append(time.perf_counter() - t0)
                codes[status] += 1
                if status == 201 and "id" not in answer:
                    raise SystemExit(f"a 201 without an order id: {answer}")
        finally:
            await (client.aclose() if use_httpx else client.close())

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(k) for k in range(concurrency)))
    return latencies, codes, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=24,
                    help="clients, one request in flight each (500 orders/s at ~50 ms needs ~25 "
                         "in flight: Little's law)")
    ap.add_argument("--workers", type=int, default=1,
                    help="uvicorn worker processes (1: one market's bids form the largest "
                         "groups in one batcher; see bench/README.md for 2)")
    ap.add_argument("--buyers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0, help="stop after this long")
    ap.add_argument("--db", default="gpumarket_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resting", type=int, default=0,
                    help="bids resting in the market before the run (the book at depth)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the database of an earlier run when it has the bench's market "
                         "(its resting bids and those the earlier runs left; new tokens), "
                         "instead of setting it up again")
    ap.add_argument("--httpx", action="store_true",
                    help="drive with httpx instead of the minimal raw HTTP/1.1 client")
    ap.add_argument("--app", default="marketplace.asgi:application",
                    help="ASGI application for uvicorn (e.g. a variant for measurement)")
    args = ap.parse_args()

    if args.reuse and database_ready(args.pg, args.db):
        env = server_env(f"{args.pg}/{args.db}")
        os.environ.update(env)
        tokens = reuse_market()
    else:
        database_url = fresh_database(args.pg, args.db)
        env = server_env(database_url)
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT,
                       env=env, check=True)
        tokens = set_up_market(args.buyers, args.resting, args.seed)
    vacuum(args.pg, args.db)
    print(f"market: {resting_count():,} bids resting", flush=True)
    from django.db import connections

    connections.close_all()

    base = f"http://127.0.0.1:{args.port}"
    # the server's own metrics (the set-up's bids are not counted in its report)
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-metrics-")}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", args.app, "--host",
         "127.0.0.1", "--port", str(args.port), "--workers", str(args.workers),
         "--no-access-log", "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        t0 = time.perf_counter()
        asyncio.run(wait_until_up(base))
        up = time.perf_counter() - t0
        pids = server_pids(server.pid)
        cpu0 = cpu_seconds(pids)
        latencies, codes, elapsed = asyncio.run(drive(
            base, tokens, orders=args.orders, concurrency=args.concurrency,
            seconds=args.seconds, seed=args.seed, use_httpx=args.httpx))
        server_cpu = cpu_seconds(pids) - cpu0
        pg_cpu = cpu_seconds(backend_pids(args.pg, args.db))
        loads = scrape(base)
    finally:
        server.terminate()
        server.wait(timeout=30)

    ms = sorted(x * 1000 for x in latencies)
    print(f"python {platform.python_version()} ({platform.python_implementation()}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min, at the "
          f"end); uvicorn workers {args.workers}, clients "
          f"{args.concurrency}, buyers {args.buyers}, resting {args.resting:,}, "
          f"database {args.db}")
    print(f"orders {len(ms)} in {elapsed:.2f} s: {len(ms) / elapsed:,.0f} orders/s; "
          f"p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, max {ms[-1]:.1f} ms; "
          f"status {dict(sorted(codes.items()))}")
    n = max(len(ms), 1)
    groups = loads.pop("gpumarket_bid_group_size_count", 0)
    size = loads.pop("gpumarket_bid_group_size_sum", 0) / groups if groups else 0
    print(f"server up (warm-up included) {up:.1f} s; CPU per order: server "
          f"{server_cpu * 1000 / n:.2f} ms, PostgreSQL backends {pg_cpu * 1000 / n:.2f} ms "
          f"(their whole life); bid groups {groups:.0f}, {size:.1f} bids each; book loads "
          + ", ".join(f"{_label(k)}: {v:.0f}" for k, v in sorted(loads.items())
                      if "how=" in k))


def _label(sample: str) -> str:
    """'name{how="hit"}' → 'hit'."""
    return sample.split('how="', 1)[1].split('"', 1)[0]


if __name__ == "__main__":
    main()
