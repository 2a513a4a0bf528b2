"""Live feed benchmark: N websocket clients on one uvicorn process while the order book
changes ~R times a second; prints delivery latency p50/p99 and missed/recovered updates.

    .venv/bin/python bench/feed.py                       # 1000 clients, 100 changes/s, 20 s
    .venv/bin/python bench/feed.py --clients 200 --rate 100 --seconds 20

Setup (all local, created by the script): PostgreSQL database `gpumarket_feedbench`
(dropped and re-created, migrated), Redis DB 5 (flushed) as the channel layer, one
`uvicorn marketplace.asgi:application` process on 127.0.0.1, one publisher process that
changes the h100-sxm-80gb book through the real services (resting bids, cancels, and
every 10th change a crossing bid whose lease is ended at once so its GPUs return), and
client processes (`--client-procs`) holding the websockets to /ws/markets/h100-sxm-80gb/.

Latency: client receive time − the message's `ts` (set by the publisher right before
group_send, after commit); same machine, same clock. Missed: seq numbers a client never
received (gaps, and the tail it had not received when the run ended); recovered: gaps
after which the client sent {"type": "resync"} and got a snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUG = "h100-sxm-80gb"


def bench_env(args) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.db}",
        "REDIS_URL": args.redis,
        "DEBUG": "0", "SECRET_KEY": "feed-bench-not-secret", "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "marketplace.settings",
    }


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def prepare(args, env) -> dict:
    import psycopg
    import redis

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
        conn.execute(f'CREATE DATABASE "{args.db}"')
    redis.Redis.from_url(args.redis).flushdb()
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)
    return {}


def seed(env) -> dict:
    django_setup(env)
    from marketplace import book
    from tests.factories import funded_buyer, in_a_day, registered_node

    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=SLUG,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    buyers = [funded_buyer(1_000_000).pk for _ in range(4)]
    return {"buyers": buyers}


def publisher(env, buyers, rate, seconds, out) -> None:
    """Change the book `rate` times a second for `seconds` through the services."""
    django_setup(env)
    from marketplace import book
    from marketplace.leases import end_lease, mark_running
    from marketplace.models import Order

    rng = random.Random(1)
    resting: list[tuple[int, int]] = []
    changes = 0
    start = time.perf_counter()
    period = 1.0 / rate
    while True:
        due = start + changes * period
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        buyer = rng.choice(buyers)
        if changes % 10 == 9:  # a trade: cross the ask, then end the lease at once
            placed = book.place_bid(buyer_id=buyer, market_slug=SLUG, price=2_500_000,
                                    gpus=1, duration_seconds=3600)
            for lease in placed.leases:
                mark_running(lease=lease, container_id="bench")
                end_lease(lease_id=lease.pk, status="completed", cause="bench")
                changes += 2  # the running lease changes no depth; the end returns GPUs
        elif len(resting) > 40 or (resting and rng.random() < 0.45):
            order_id, owner = resting.pop(rng.randrange(len(resting)))
            if Order.objects.filter(pk=order_id, status__in=Order.ACTIVE).exists():
                book.cancel_order(user_id=owner, order_id=order_id)
        else:
            price = rng.randrange(100, 240) * 10_000
            placed = book.place_bid(buyer_id=buyer, market_slug=SLUG, price=price,
                                    gpus=rng.randint(1, 4), duration_seconds=3600)
            resting.append((placed.order.pk, buyer))
        changes += 1
    out.put({"changes": changes, "elapsed": time.perf_counter() - start})


def clients(port, count, stop_at, started, out) -> None:
    asyncio.run(_clients(port, count, stop_at, started, out))


async def _clients(port, count, stop_at, started, out) -> None:
    from websockets.asyncio.client import connect

    uri = f"ws://127.0.0.1:{port}/ws/markets/{SLUG}/"
    latencies: list[float] = []
    stats = {"missed": 0, "recovered": 0, "resync_required": 0, "messages": 0,
             "connected": 0, "failed": 0, "last_seqs": [], "first_seqs": []}

    async def one(ready: asyncio.Event, gate: asyncio.Semaphore):
        try:
            async with gate:
                ws = await connect(uri, origin="http://127.0.0.1", compression=None,
                                   max_queue=None, open_timeout=60)
        except Exception:
            stats["failed"] += 1
            return
        stats["connected"] += 1
        last = None
        try:
            while True:
                if stop_at.value and time.time() >= stop_at.value:
                    break
                try:  # recv() is cancellation-safe in websockets ≥ 13
                    raw = await asyncio.wait_for(ws.recv(), 0.5)
                except TimeoutError:
                    continue
                received = time.time()
                msg = json.loads(raw)
                kind = msg["type"]
                if kind == "snapshot":
                    if last is None:
                        stats["first_seqs"].append(msg["seq"])
                    else:
                        stats["recovered"] += 1
                    last = msg["seq"]
                    continue
                if kind == "resync_required":
                    stats["resync_required"] += 1
                    continue
                latencies.append(received - msg["ts"])
                stats["messages"] += 1
                seq = msg["seq"]
                if seq <= last:
                    continue
                if seq > last + 1:
                    stats["missed"] += seq - last - 1
                    await ws.send('{"type":"resync"}')
                last = seq
        finally:
            stats["last_seqs"].append(last or 0)
            await ws.close()

    gate = asyncio.Semaphore(50)
    ready = asyncio.Event()
    tasks = [asyncio.create_task(one(ready, gate)) for _ in range(count)]
    while stats["connected"] + stats["failed"] < count:
        await asyncio.sleep(0.1)
    started.release()
    await asyncio.gather(*tasks)
    out.put({"latencies": latencies, **stats})


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"uvicorn did not listen on {port}")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100, help="book changes per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--db", default="gpumarket_feedbench")
    # socket_timeout above channels_redis's 5 s BZPOPMIN: redis-py 8 defaults to 5 s,
    # which kills every consumer idle for 5 s (redis/redis-py#4091)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5?socket_timeout=30")
    args = parser.parse_args()
    env = bench_env(args)
    prepare(args, env)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ctx.Pool(1) as pool:
        seeded = pool.apply(seed, (env,))
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
         "127.0.0.1", "--port", str(args.port), "--ws", "websockets", "--log-level",
         "warning", "--no-access-log"], cwd=ROOT, env=env)
    try:
        wait_port(args.port)
        stop_at = ctx.Value("d", 0.0)
        started = ctx.Semaphore(0)
        per = [args.clients // args.client_procs + (i < args.clients % args.client_procs)
               for i in range(args.client_procs)]
        procs = [ctx.Process(target=clients, args=(args.port, n, stop_at, started, out))
                 for n in per]
        t0 = time.time()
        for p in procs:
            p.start()
        for _ in procs:
            started.acquire()
        connect_s = time.time() - t0
        print(f"{sum(per)} clients connected in {connect_s:.1f} s; publishing", flush=True)
        time.sleep(1)
        pub = ctx.Process(target=publisher,
                          args=(env, seeded["buyers"], args.rate, args.seconds, out))
        pub.start()
        pub.join()
        print("publisher done; waiting for the tail", flush=True)
        stop_at.value = time.time() + 5  # let the tail arrive
        results = [out.get() for _ in range(len(procs) + 1)]
        for p in procs:
            p.join()
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    import redis

    final_seq = int(redis.Redis.from_url(args.redis).get(
        f"gpumarket:feed:seq:market.{SLUG}") or 0)
    pub_result = next(r for r in results if "changes" in r)
    client_results = [r for r in results if "latencies" in r]
    latencies = [x for r in client_results for x in r["latencies"]]
    total = {k: sum(r[k] for r in client_results)
             for k in ("missed", "recovered", "resync_required", "messages", "connected",
                       "failed")}
    expected = sum(final_seq - s for r in client_results for s in r["first_seqs"])
    tail_missed = sum(max(0, final_seq - s) for r in client_results for s in r["last_seqs"])
    print(f"feed bench: {args.clients} clients in {args.client_procs} process(es), one "
          f"uvicorn process, Redis channel layer {args.redis}, PostgreSQL {args.db}")
    print(f"connected {total['connected']} (failed {total['failed']}) in {connect_s:.1f} s")
    print(f"book changes: {pub_result['changes']} in {pub_result['elapsed']:.1f} s "
          f"({pub_result['changes'] / pub_result['elapsed']:.0f}/s); market group "
          f"messages published: {final_seq}")
    print(f"delivered messages: {total['messages']} "
          f"(expected {expected}: every message after each client's first snapshot)")
    print(f"latency p50 {pct(latencies, 50) * 1000:.1f} ms, p99 {pct(latencies, 99) * 1000:.1f}"
          f" ms, max {max(latencies, default=float('nan')) * 1000:.1f} ms")
    print(f"missed (gaps) {total['missed']}, recovered by resync {total['recovered']}, "
          f"server resync_required {total['resync_required']}, not received by the end "
          f"{tail_missed}")


if __name__ == "__main__":
    main()
