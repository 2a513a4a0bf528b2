"""Live feed benchmark: N websocket clients on one uvicorn process while the order book
changes ~R times a second; prints delivery latency p50/p99 and missed/recovered updates.

    .venv/bin/python bench/feed.py                       # 1000 clients, 100 changes/s, 20 s
    .venv/bin/python bench/feed.py --clients 200 --rate 100 --seconds 20

Setup (all local, created by the script): PostgreSQL database `gpumarket_feedbench`
(dropped and re-created, migrated), Redis DB 5 (flushed) as the channel layer, one
`uvicorn marketplace.asgi:application` process on 127.0.0.1, `--publishers` processes
that change the h100-sxm-80gb book through the real services (resting bids, cancels, and
every 10th change a crossing bid whose lease is ended at once so its GPUs return), each
at rate/publishers, and `--client-procs` processes holding the websockets to
/ws/markets/h100-sxm-80gb/ (never in the server's process).

Timing: the publishers run for `--seconds`; the first `--warmup` seconds are excluded
from the latency figures (messages whose `ts` is earlier are not counted). Latency:
client receive time − the message's `ts` (set by the server's publisher thread right
before it sends, after commit); same machine, same clock. End to end adds, per message,
the time from the commit of the earliest change it carries to its `ts` (queueing in the
publisher thread and depth coalescing), recorded by the publishing process. Missed: seq
numbers a client never received (gaps, and the tail it had not received when the run
ended); recovered: gaps after which the client sent {"type": "resync"} and got a
snapshot; server resync_required: the server dropped a slow client's backlog.
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
from array import array
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


def publisher(env, buyers, rate, seconds, warmup, index, start_at, out) -> None:
    """Change the book `rate` times a second for `seconds` through the services."""
    django_setup(env)
    from frontend import feed
    from marketplace import book
    from marketplace.leases import end_lease, mark_running
    from marketplace.models import Order

    recording = hasattr(feed, "publisher")  # (absent from the pre-hub feed)
    if recording:
        feed.publisher().delays = {}
    rng = random.Random(index + 1)
    buyers = buyers[index::max(1, len(buyers) // 2)] or buyers
    resting: list[tuple[int, int]] = []
    changes = measured = 0
    while time.time() < start_at.value:
        time.sleep(0.01)
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
        done = 1
        if changes % 10 == 9:  # a trade: cross the ask, then end the lease at once
            placed = book.place_bid(buyer_id=buyer, market_slug=SLUG, price=2_500_000,
                                    gpus=1, duration_seconds=3600)
            for lease in placed.leases:
                mark_running(lease=lease, container_id="bench")
                end_lease(lease_id=lease.pk, status="completed", cause="bench")
                done += 2  # the running lease changes no depth; the end returns GPUs
        elif len(resting) > 40 or (resting and rng.random() < 0.45):
            order_id, owner = resting.pop(rng.randrange(len(resting)))
            if Order.objects.filter(pk=order_id, status__in=Order.ACTIVE).exists():
                book.cancel_order(user_id=owner, order_id=order_id)
        else:
            price = rng.randrange(100, 240) * 10_000
            placed = book.place_bid(buyer_id=buyer, market_slug=SLUG, price=price,
                                    gpus=rng.randint(1, 4), duration_seconds=3600)
            resting.append((placed.order.pk, buyer))
        changes += done
        if time.perf_counter() - start >= warmup:
            measured += done
    elapsed = time.perf_counter() - start
    delays = {}
    if recording:
        feed.flush()
        group = feed.market_group(SLUG)
        delays = {seq: d for (g, seq), d in feed.publisher().delays.items() if g == group}
    out.put({"changes": changes, "measured": measured, "elapsed": elapsed,
             "delays": delays, "cpu": cpu_seconds()})


def clients(port, count, stop_at, measure_from, started, out) -> None:
    asyncio.run(_clients(port, count, stop_at, measure_from, started, out))


async def _clients(port, count, stop_at, measure_from, started, out) -> None:
    from websockets.asyncio.client import connect

    uri = f"ws://127.0.0.1:{port}/ws/markets/{SLUG}/"
    latencies = array("d")
    lat_seqs = array("q")
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
        open_sockets.add(ws)
        last = None
        resyncing = False
        try:
            async for raw in ws:  # ends when the watchdog closes the connections
                received = time.time()
                # Cheap parsing, so the load generator measures the server rather than
                # itself: the server writes "type" first and "seq", "ts" last in every
                # message (frontend/feed.py); snapshots and warnings are fully parsed.
                if not raw.startswith('{"type":"depth"') and \
                        not raw.startswith('{"type":"trade"'):
                    msg = json.loads(raw)
                    kind = msg["type"]
                    if kind == "snapshot":
                        resyncing = False
                        if last is None:
                            stats["first_seqs"].append(msg["seq"])
                        else:
                            stats["recovered"] += 1
                        last = msg["seq"]
                        continue
                    if kind == "resync_required":  # the protocol: answer with a resync
                        stats["resync_required"] += 1
                        if not resyncing:
                            resyncing = True
                            await ws.send('{"type":"resync"}')
                        continue
                    seq, ts = msg["seq"], msg["ts"]
                else:
                    tail = raw[raw.rindex('"seq":') + 6:-1]
                    seq_text, ts_text = tail.split(',"ts":')
                    seq, ts = int(seq_text), float(ts_text)
                stats["messages"] += 1
                if measure_from.value and ts >= measure_from.value:
                    latencies.append(received - ts)
                    lat_seqs.append(seq)
                if seq <= last:
                    continue
                if seq > last + 1:
                    stats["missed"] += seq - last - 1
                    if not resyncing:
                        resyncing = True
                        await ws.send('{"type":"resync"}')
                last = seq
        except Exception:
            pass
        finally:
            stats["last_seqs"].append(last or 0)
            open_sockets.discard(ws)
            await ws.close()

    open_sockets: set = set()

    async def watchdog():
        while not (stop_at.value and time.time() >= stop_at.value):
            await asyncio.sleep(0.2)
        for ws in list(open_sockets):
            await ws.close()

    gate = asyncio.Semaphore(50)
    ready = asyncio.Event()
    tasks = [asyncio.create_task(one(ready, gate)) for _ in range(count)]
    while stats["connected"] + stats["failed"] < count:
        await asyncio.sleep(0.1)
    started.release()
    await asyncio.gather(*tasks, watchdog())
    out.put({"latencies": latencies, "lat_seqs": lat_seqs, "cpu": cpu_seconds(), **stats})


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one by default)."""
    fields = Path(f"/proc/{pid or os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (all processes, all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


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
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--publishers", type=int, default=2,
                        help="publishing processes, each at rate/publishers")
    parser.add_argument("--rate", type=float, default=100, help="book changes per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3,
                        help="seconds at the start excluded from the latency figures")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ws", default="websockets-sansio",
                        help="uvicorn's websocket implementation (--ws)")
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
         "127.0.0.1", "--port", str(args.port), "--ws", args.ws, "--log-level",
         "warning", "--no-access-log"], cwd=ROOT, env=env)
    try:
        wait_port(args.port)
        stop_at = ctx.Value("d", 0.0)
        measure_from = ctx.Value("d", 0.0)
        start_at = ctx.Value("d", float("inf"))  # publishers wait for the start signal
        started = ctx.Semaphore(0)
        per = [args.clients // args.client_procs + (i < args.clients % args.client_procs)
               for i in range(args.client_procs)]
        procs = [ctx.Process(target=clients, args=(args.port, n, stop_at, measure_from,
                                                   started, out))
                 for n in per]
        t0 = time.time()
        for p in procs:
            p.start()
        for _ in procs:
            started.acquire()
        connect_s = time.time() - t0
        print(f"{sum(per)} clients connected in {connect_s:.1f} s; publishing", flush=True)
        pubs = [ctx.Process(target=publisher,
                            args=(env, seeded["buyers"], args.rate / args.publishers,
                                  args.seconds, args.warmup, i, start_at, out))
                for i in range(args.publishers)]
        busy0, wall0 = machine_busy(), time.time()
        for p in pubs:
            p.start()
        time.sleep(3)  # let the publishers import Django
        start_at.value = time.time() + 0.5
        measure_from.value = start_at.value + args.warmup
        for p in pubs:
            p.join()
        busy, wall = machine_busy() - busy0, time.time() - wall0
        print("publishers done; waiting for the tail", flush=True)
        stop_at.value = time.time() + 5  # let the tail arrive
        results = [out.get() for _ in range(len(procs) + len(pubs))]
        for p in procs:
            p.join()
        server_cpu = cpu_seconds(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    import redis

    final_seq = int(redis.Redis.from_url(args.redis).get(
        f"gpumarket:feed:seq:market.{SLUG}") or 0)
    pub_results = [r for r in results if "changes" in r]
    client_results = [r for r in results if "latencies" in r]
    delays: dict[int, float] = {}
    for r in pub_results:
        delays.update(r["delays"])
    latencies = [x for r in client_results for x in r["latencies"]]
    e2e = [lat + delays.get(seq, 0.0) for r in client_results
           for lat, seq in zip(r["latencies"], r["lat_seqs"], strict=True)]
    total = {k: sum(r[k] for r in client_results)
             for k in ("missed", "recovered", "resync_required", "messages", "connected",
                       "failed")}
    expected = sum(final_seq - s for r in client_results for s in r["first_seqs"])
    tail_missed = sum(max(0, final_seq - s) for r in client_results for s in r["last_seqs"])
    changes = sum(r["changes"] for r in pub_results)
    measured = sum(r["measured"] for r in pub_results)
    elapsed = max(r["elapsed"] for r in pub_results)
    window = max(1e-9, elapsed - args.warmup)
    print(f"feed bench: {args.clients} clients in {args.client_procs} process(es), one "
          f"uvicorn process, {args.publishers} publisher process(es), Redis {args.redis}, "
          f"PostgreSQL {args.db}, {os.cpu_count()} CPUs")
    print(f"connected {total['connected']} (failed {total['failed']}) in {connect_s:.1f} s")
    print(f"book changes: {changes} in {elapsed:.1f} s ({changes / elapsed:.0f}/s asked "
          f"{args.rate:.0f}/s); after the {args.warmup:.0f} s warm-up: {measured} in "
          f"{window:.1f} s ({measured / window:.0f}/s); market group messages published: "
          f"{final_seq}")
    print(f"delivered messages: {total['messages']} "
          f"(expected {expected}: every message after each client's first snapshot)")
    print(f"latency (receive - ts), {len(latencies)} messages after warm-up: "
          f"p50 {pct(latencies, 50) * 1000:.1f} ms, p99 {pct(latencies, 99) * 1000:.1f} ms, "
          f"max {max(latencies, default=float('nan')) * 1000:.1f} ms")
    if delays:
        print(f"end to end (receive - commit of the earliest change carried): "
              f"p50 {pct(e2e, 50) * 1000:.1f} ms, p99 {pct(e2e, 99) * 1000:.1f} ms, "
              f"max {max(e2e, default=float('nan')) * 1000:.1f} ms")
    print(f"machine: {busy / wall:.2f} of {os.cpu_count()} cores busy while publishing "
          f"(everything on the machine, this bench's processes and any others)")
    print(f"CPU seconds: server {server_cpu:.1f}, clients "
          f"{sum(r['cpu'] for r in client_results):.1f}, publishers "
          f"{sum(r['cpu'] for r in pub_results):.1f} (whole run, incl. connect)")
    print(f"missed (gaps) {total['missed']}, recovered by resync {total['recovered']}, "
          f"server resync_required {total['resync_required']}, not received by the end "
          f"{tail_missed}")


if __name__ == "__main__":
    main()
