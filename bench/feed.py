"""Live feed benchmark: N websocket clients on one uvicorn process while the order book
changes ~R times a second; prints delivery latency p50/p99 and missed/recovered updates.

    .venv/bin/python bench/feed.py                       # 1000 clients, 100 changes/s, 20 s
    .venv/bin/python bench/feed.py --changes services --publishers 2   # the real services

Setup (all local, created by the script): PostgreSQL database `gpumarket_feedbench`
(dropped and re-created, migrated), Redis DB 5 (flushed) as the channel layer, one
`uvicorn bench.feed_asgi:application` process on 127.0.0.1 (marketplace.asgi, plus the
optional recordings of bench/feed_asgi.py), `--publishers` processes that change the
h100-sxm-80gb book `--rate` times a second in all (resting bids, cancels, and every 10th
change a trade), and `--client-procs` processes holding the websockets to
/ws/markets/h100-sxm-80gb/ (never in the server's process; a minimal RFC 6455 client on
uvloop, so that the load generator stays cheap; `--deflate` negotiates permessage-deflate
as browsers do).

How the book changes (`--changes`): "direct" (default) writes the order and fill rows,
one transaction per change, so that one process reaches 100 changes/s on a 2-core
machine; "services" goes through book.place_bid / cancel_order / end_lease (holds,
matching, ledger), about 17 ms of CPU per change in the publishing process, which caps
it near 40 changes/s per process here. For the feed both are the same: a committed
change noted by the post_save receivers and published after commit by the process's
feed publisher thread (depth read, seq, Redis pub/sub).

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
import tempfile
import time
import zlib
from array import array
from pathlib import Path

from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.api_orders import drop_bench_database, mark_bench_database  # noqa: E402

SLUG = "h100-sxm-80gb"


BENCH_SECRETS_KEY = Fernet.generate_key().decode()  # one per run, for every process


def bench_env(args) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.db}",
        "REDIS_URL": args.redis,
        "DEBUG": "0", "SECRET_KEY": "feed-bench-not-secret", "LOG_LEVEL": "WARNING",
        "GPUMARKET_SECRETS_KEY": BENCH_SECRETS_KEY,
        "GPUMARKET_SSL_REDIRECT": "0",  # plain http on 127.0.0.1
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
        drop_bench_database(conn, args.db)
        conn.execute(f'CREATE DATABASE "{args.db}"')
        mark_bench_database(conn, args.db)
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


def _service_change(rng, buyer, n, resting) -> int:
    """One change through the services; returns how many book changes it made."""
    from marketplace import book
    from marketplace.lease_end import end_lease
    from marketplace.leases import mark_running
    from marketplace.models import Order

    done = 1
    if n % 10 == 9:  # a trade: cross the ask, then end the lease at once
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
    return done


_ASK: list = []


def _direct_change(rng, buyer, n, resting) -> int:
    """One change as rows written directly (one transaction): a resting bid, its
    cancellation, or every 10th change a trade (a filled bid and its fill). No holds, no
    matching: the bench database is thrown away."""
    from django.db import transaction

    from marketplace.models import Fill, GpuClass, Order

    if not _ASK:
        _ASK.append(Order.objects.get(market__slug=SLUG, side=Order.Side.ASK,
                                      status__in=Order.ACTIVE))
    ask = _ASK[0]
    with transaction.atomic():
        if n % 10 == 9:
            bid = Order.objects.create(market_id=ask.market_id, owner_id=buyer, side="bid",
                                       status="filled", price=2_500_000, gpus=1,
                                       remaining_gpus=0, duration_seconds=3600)
            Fill.objects.create(market_id=ask.market_id, bid=bid, ask=ask, gpus=1,
                                price=ask.price)
        elif len(resting) > 40 or (resting and rng.random() < 0.45):
            order = resting.pop(rng.randrange(len(resting)))
            order.status = "cancelled"
            order.save(update_fields=["status"])
        else:
            gpus = rng.randint(1, 4)
            resting.append(Order.objects.create(
                market=GpuClass(pk=ask.market_id, slug=SLUG), owner_id=buyer, side="bid",
                status="open", price=rng.randrange(100, 240) * 10_000, gpus=gpus,
                remaining_gpus=gpus, duration_seconds=3600))
    return 1


def publisher(env, buyers, rate, seconds, warmup, index, start_at, out, mode) -> None:
    """Change the book `rate` times a second for `seconds`: through the market's services
    (mode "services"), or (mode "direct") by writing the order and fill rows directly, one
    transaction per change, which costs the publishing process a fraction of the
    services' matching, holds and ledger entries while the feed sees the same thing: a
    committed change of the book noted by the post_save receivers, published after commit
    by the process's feed publisher thread (depth read, seq, Redis pub/sub)."""
    django_setup(env)
    from frontend import feed

    change = _direct_change if mode == "direct" else _service_change
    recording = hasattr(feed, "publisher")  # (absent from the pre-hub feed)
    if recording:
        feed.publisher().delays = {}
    rng = random.Random(index + 1)
    buyers = buyers[index::max(1, len(buyers) // 2)] or buyers
    resting: list = []  # (order id, owner) for services, Order rows for direct
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
        done = change(rng, rng.choice(buyers), changes, resting)
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


def clients(port, count, stop_at, measure_from, started, out, deflate=False) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_clients(port, count, stop_at, measure_from, started, out, deflate))


class _Client(asyncio.Protocol):
    """A minimal websocket client (RFC 6455) on a bare asyncio protocol: the load
    generator has to stay far cheaper than the server it measures (the `websockets`
    client cost about as much CPU per message as the server; on 2 shared cores that
    showed up as latency). Server frames are unmasked; the only client frame, the
    resync request, is masked as the RFC requires."""

    RESYNC = b"\x81\x91" + b"\x00\x00\x00\x00" + b'{"type":"resync"}'  # mask key 0

    def __init__(self, stats, latencies, lat_seqs, measure_from):
        self.stats, self.latencies, self.lat_seqs = stats, latencies, lat_seqs
        self.measure_from = measure_from
        self.buf = bytearray()
        self.handshake = True
        self.opened = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self.last: int | None = None
        self.resyncing = False
        self.transport = None
        self.inflate = zlib.decompressobj(-15)

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed in handshake"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data):
        received = time.time()
        buf = self.buf
        buf += data
        if self.handshake:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.opened.set_exception(ConnectionError(bytes(buf[:40])))
                self.transport.close()
                return
            del buf[:end + 4]
            self.handshake = False
            self.opened.set_result(None)
        while len(buf) >= 2:
            opcode, length = buf[0] & 0x0F, buf[1] & 0x7F
            head = 2
            if length == 126:
                if len(buf) < 4:
                    return
                length, head = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                if len(buf) < 10:
                    return
                length, head = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < head + length:
                return
            payload = bytes(buf[head:head + length])
            compressed = buf[0] & 0x40
            del buf[:head + length]
            if compressed:  # permessage-deflate (RFC 7692), context kept between messages
                payload = self.inflate.decompress(payload + b"\x00\x00\xff\xff")
            if opcode == 0x1:
                self.message(payload, received)
            elif opcode == 0x9:  # ping → pong (masked, key 0)
                self.transport.write(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0"
                                     + payload)
            elif opcode == 0x8:
                self.transport.close()
                return

    def message(self, raw: bytes, received: float) -> None:
        stats = self.stats
        # depth and trade frames: "type" first, "seq" and "ts" last (frontend/feed.py), so
        # they are read from the tail; snapshots and warnings are parsed in full
        if raw.startswith(b'{"type":"depth"') or raw.startswith(b'{"type":"trade"'):
            tail = raw[raw.rindex(b'"seq":') + 6:-1]
            seq_text, ts_text = tail.split(b',"ts":')
            seq, ts = int(seq_text), float(ts_text)
        else:
            msg = json.loads(raw)
            kind = msg["type"]
            if kind == "snapshot":
                self.resyncing = False
                if self.last is None:
                    stats["first_seqs"].append(msg["seq"])
                else:
                    stats["recovered"] += 1
                self.last = msg["seq"]
                return
            if kind == "resync_required":  # the protocol: answer with a resync
                stats["resync_required"] += 1
                self.resync()
                return
            seq, ts = msg["seq"], msg["ts"]
        stats["messages"] += 1
        if self.measure_from.value and ts >= self.measure_from.value:
            self.latencies.append(received - ts)
            self.lat_seqs.append(seq)
        last = self.last
        if last is None or seq <= last:
            return
        if seq > last + 1:
            stats["missed"] += seq - last - 1
            self.resync()
        self.last = seq

    def resync(self) -> None:
        if not self.resyncing:
            self.resyncing = True
            self.transport.write(self.RESYNC)


async def _clients(port, count, stop_at, measure_from, started, out, deflate) -> None:
    import base64

    loop = asyncio.get_running_loop()
    path = f"/ws/markets/{SLUG}/"
    latencies = array("d")
    lat_seqs = array("q")
    stats = {"missed": 0, "recovered": 0, "resync_required": 0, "messages": 0,
             "connected": 0, "failed": 0, "last_seqs": [], "first_seqs": []}
    protocols: list[_Client] = []

    async def one(gate: asyncio.Semaphore):
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   f"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1\r\n"
                   + ("Sec-WebSocket-Extensions: permessage-deflate; "
                      "client_max_window_bits\r\n" if deflate else "") + "\r\n")
        try:
            async with gate:
                _, proto = await loop.create_connection(
                    lambda: _Client(stats, latencies, lat_seqs, measure_from),
                    "127.0.0.1", port)
                proto.transport.write(request.encode())
                await asyncio.wait_for(proto.opened, 60)
        except Exception:
            stats["failed"] += 1
            return
        stats["connected"] += 1
        protocols.append(proto)

    gate = asyncio.Semaphore(50)
    await asyncio.gather(*(one(gate) for _ in range(count)))
    started.release()
    while not (stop_at.value and time.time() >= stop_at.value):
        await asyncio.sleep(0.2)
    for proto in protocols:
        stats["last_seqs"].append(proto.last or 0)
        proto.transport.write(b"\x88\x82\0\0\0\0\x03\xe8")  # close 1000 (masked)
    await asyncio.sleep(0.5)
    for proto in protocols:
        proto.transport.close()
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
    parser.add_argument("--publishers", type=int, default=1,
                        help="publishing processes, each at rate/publishers")
    parser.add_argument("--changes", choices=("services", "direct"), default="direct",
                        help="how the publishers change the book (see publisher())")
    parser.add_argument("--rate", type=float, default=100, help="book changes per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3,
                        help="seconds at the start excluded from the latency figures")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ws", default="websockets-sansio",
                        help="uvicorn's websocket implementation (--ws)")
    parser.add_argument("--app", default="bench.feed_asgi:application",
                        help="the ASGI application (default: marketplace.asgi plus the "
                             "server-side write times, bench/feed_asgi.py)")
    parser.add_argument("--deflate", action="store_true",
                        help="clients negotiate permessage-deflate, as browsers do (the "
                             "server then compresses every frame for every client)")
    parser.add_argument("--server-times", action="store_true",
                        help="also record when the server wrote each frame "
                             "(bench/feed_asgi.py; it wraps ASGI send, which turns the "
                             "feed's direct frame writes off: frontend/consumers.py)")
    parser.add_argument("--profile", default="",
                        help="write a sampling profile of the server to this file")
    parser.add_argument("--db", default="gpumarket_feedbench")
    # socket_timeout above channels_redis's 5 s BZPOPMIN: redis-py 8 defaults to 5 s,
    # which kills every consumer idle for 5 s (redis/redis-py#4091)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5?socket_timeout=30")
    args = parser.parse_args()
    load_before = f"{os.getloadavg()[0]:.2f}"  # the machine may be shared: say how busy
    env = bench_env(args)
    prepare(args, env)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ctx.Pool(1) as pool:
        seeded = pool.apply(seed, (env,))
    writes_file = Path(tempfile.mkdtemp(prefix="feedbench")) / "writes.bin"
    server_env = dict(env)
    if args.server_times:
        server_env["FEED_BENCH_WRITES"] = str(writes_file)
    if args.profile:
        server_env["FEED_BENCH_SAMPLE"] = str(Path(args.profile).resolve())
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", args.app, "--host",
         "127.0.0.1", "--port", str(args.port), "--ws", args.ws, "--log-level",
         "warning", "--no-access-log"], cwd=ROOT, env=server_env)
    try:
        wait_port(args.port)
        stop_at = ctx.Value("d", 0.0)
        measure_from = ctx.Value("d", 0.0)
        start_at = ctx.Value("d", float("inf"))  # publishers wait for the start signal
        started = ctx.Semaphore(0)
        per = [args.clients // args.client_procs + (i < args.clients % args.client_procs)
               for i in range(args.client_procs)]
        procs = [ctx.Process(target=clients, args=(args.port, n, stop_at, measure_from,
                                                   started, out, args.deflate))
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
                                  args.seconds, args.warmup, i, start_at, out,
                                  args.changes))
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
          f"uvicorn process ({args.app}, --ws {args.ws}), {args.publishers} publisher "
          f"process(es) ({args.changes} changes), "
          f"{'permessage-deflate' if args.deflate else 'uncompressed'} frames, Redis "
          f"{args.redis}, PostgreSQL {args.db}, {os.cpu_count()} CPUs; load average before "
          f"{load_before}, after {os.getloadavg()[0]:.2f}")
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
    server_side = []
    if writes_file.exists():
        pairs = array("d")
        pairs.frombytes(writes_file.read_bytes())
        server_side = [pairs[i + 1] - pairs[i] for i in range(0, len(pairs), 2)
                       if pairs[i] >= measure_from.value]
        writes_file.unlink()
    if server_side:
        print(f"  of which in the server (written to the socket - ts), {len(server_side)} "
              f"frames: p50 {pct(server_side, 50) * 1000:.1f} ms, "
              f"p99 {pct(server_side, 99) * 1000:.1f} ms, "
              f"max {max(server_side) * 1000:.1f} ms")
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
