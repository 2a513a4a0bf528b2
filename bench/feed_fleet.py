"""Live feed at fleet size: N websocket clients spread over several uvicorn web processes
(as behind a load balancer), several markets and the feeds a real UI opens, while
publishers change the books; end-to-end latency and every message counted per client.

    .venv/bin/python bench/feed_fleet.py --clients 10000 --web 2     # 10,000 over 2 processes
    .venv/bin/python bench/feed_fleet.py --clients 1000 --web 1      # the old bench's size

What the clients open (`--me`, `--summary`, `--markets`): a share `--summary` of the
websockets is the home page (/ws/summary/), a share `--me` is /ws/me/ of a signed-in user
(one per user, `Authorization: Bearer` API token), the rest are market pages
(/ws/markets/<slug>/), spread over `--markets` markets by weights 1, 1/2, 1/3, ... (the
first market the busiest). The publishers change the markets in the same proportions,
`--rate` changes a second in all (bench/feed.py's "direct" changes: a resting bid, its
cancel, every 10th change a trade), each order owned by one of the /ws/me/ users, so
those receive their `order` messages.

Clients are bench/feed.py's minimal RFC 6455 client on uvloop, in `--client-procs`
processes, each connection assigned to a web process round robin; the file descriptor
limit is raised to its hard limit. Each connection checks its group's seq numbers:
`missed` = seqs skipped (it resyncs), `not received by the end` = the group's last seq
(read from Redis after the tail wait) minus the client's last.

End to end, per message and client: client receive time − the commit of the earliest
change the message carries (= receive − the message's `ts`, plus `ts` − commit recorded
by the publishing process for that (group, seq)). Same machine, same clock. Web CPU: CPU
seconds of each uvicorn process during the publishing window (connects excluded) per
second of it. Load average before and after in the header line.

Setup (created by the script): PostgreSQL `--db` (dropped, re-created, migrated), Redis
`--redis` (its database flushed), `--web` uvicorn processes on ports `--port`,
`--port`+1, ...
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.feed import (  # noqa: E402
    _Client,
    bench_env,
    cpu_seconds,
    django_setup,
    machine_busy,
    pct,
    prepare,
    wait_port,
)

DUMPS = ("h100-80gb-hbm3-x8.driver-535.183.01.txt", "rtx-4090-x8.driver-535.154.05.txt",
         "a100-sxm4-40gb-x8.xuesongtap-blog.q.txt", "v100-sxm2-16gb-x8.thamada-gls.q.txt",
         "rtx6000ada-x8.thamada-gls.q.txt", "a40-x10.thamada-gls.q.txt")


def raise_nofile() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def weights(n: int) -> list[float]:
    raw = [1 / (i + 1) for i in range(n)]
    return [w / sum(raw) for w in raw]


def seed(env, markets: int, users: int) -> dict:
    """One provider node with an ask per market, `users` users with an API token each."""
    django_setup(env)
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace import api_tokens, book
    from marketplace.models import ApiToken
    from tests.factories import in_a_day, registered_node

    slugs = []
    for i, dump in enumerate(DUMPS[:markets]):
        provider, node, _ = registered_node(ROOT / "data" / "nvidia-smi" / dump,
                                            name=f"fleet-{i}", own_uuids=True)
        slug = node.gpus.first().gpu_class.slug
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=slug,
                       price=2_490_000, gpus=node.gpus.count(), available_until=in_a_day())
        slugs.append(slug)
    User = get_user_model()
    User.objects.bulk_create([User(username=f"fleet{i}", password="!") for i in range(users)],
                             batch_size=1000)
    ids = list(User.objects.filter(username__startswith="fleet").order_by("pk")
               .values_list("pk", flat=True))
    keys = [api_tokens.TOKEN_PREFIX + base64.urlsafe_b64encode(os.urandom(24)).decode()
            for _ in ids]
    expires = timezone.now() + timedelta(days=1)
    ApiToken.objects.bulk_create(
        [ApiToken(user_id=u, name="fleet", prefix=k[:api_tokens.PREFIX_CHARS],
                  key_hash=api_tokens.hash_key(k), expires_at=expires)
         for u, k in zip(ids, keys, strict=True)], batch_size=1000)
    return {"slugs": slugs, "users": ids, "keys": keys}


def publisher(env, slugs, users, rate, seconds, warmup, index, start_at, out) -> None:
    """`rate` changes a second for `seconds`, each in a market drawn by `weights`, owned
    by one of `users`; records (group, seq) → ts − commit of every message it sends."""
    django_setup(env)
    from django.db import transaction

    from frontend import feed
    from marketplace.models import Fill, Order

    feed.publisher().delays = {}
    rng = random.Random(index + 1)
    asks = {s: Order.objects.get(market__slug=s, side="ask", status__in=Order.ACTIVE)
            for s in slugs}
    resting: dict[str, list] = {s: [] for s in slugs}
    w = weights(len(slugs))
    changes = 0
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
        slug = rng.choices(slugs, w)[0]
        ask, rest, buyer = asks[slug], resting[slug], rng.choice(users)
        with transaction.atomic():
            if changes % 10 == 9:
                bid = Order.objects.create(market_id=ask.market_id, owner_id=buyer,
                                           side="bid", status="filled", price=2_500_000,
                                           gpus=1, remaining_gpus=0, duration_seconds=3600)
                Fill.objects.create(market_id=ask.market_id, bid=bid, ask=ask, gpus=1,
                                    price=ask.price)
            elif len(rest) > 40 or (rest and rng.random() < 0.45):
                order = rest.pop(rng.randrange(len(rest)))
                order.status = "cancelled"
                order.save(update_fields=["status"])
            else:
                gpus = rng.randint(1, 4)
                rest.append(Order.objects.create(
                    market_id=ask.market_id, owner_id=buyer, side="bid", status="open",
                    price=rng.randrange(100, 240) * 10_000, gpus=gpus, remaining_gpus=gpus,
                    duration_seconds=3600))
        changes += 1
    elapsed = time.perf_counter() - start
    feed.flush(30)
    out.put({"changes": changes, "elapsed": elapsed, "cpu": cpu_seconds(),
             "delays": dict(feed.publisher().delays)})


class _FleetClient(_Client):
    """bench/feed.py's client for any feed: every message's seq and ts are read from its
    tail (the feed puts them last); a gap is counted and answered with a resync."""

    def __init__(self, stats, sink, gid, measure_from):
        super().__init__(stats, None, None, measure_from)
        self.sink, self.gid, self.first = sink, gid, None

    def message(self, raw: bytes, received: float) -> None:
        stats = self.stats
        if raw.startswith(b'{"type":"resync_required"'):  # the server saw a gap
            stats["resync_required"] += 1
            self.resync()
            return
        try:
            tail = raw[raw.rindex(b'"seq":') + 6:-1]
            seq_text, ts_text = tail.split(b',"ts":')
            seq, ts = int(seq_text), float(ts_text)
        except ValueError:  # an error message: no seq
            stats["other"] += 1
            return
        if raw.startswith(b'{"type":"snapshot"'):
            self.resyncing = False
            if self.last is None:
                self.first = seq
            else:
                stats["recovered"] += 1
            self.last = seq
            return
        stats["messages"] += 1
        if self.measure_from.value and ts >= self.measure_from.value:
            lat, gids, seqs = self.sink
            lat.append(received - ts)
            gids.append(self.gid)
            seqs.append(seq)
        last = self.last
        if last is None or seq <= last:
            stats["stale"] += 1
            return
        if seq > last + 1:
            stats["missed"] += seq - last - 1
            self.resync()
        self.last = seq


def clients(specs, ports, stop_at, measure_from, started, out) -> None:
    raise_nofile()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_clients(specs, ports, stop_at, measure_from, started, out))


async def _clients(specs, ports, stop_at, measure_from, started, out) -> None:
    """specs: [(connection index, group, path, token or None)]."""
    loop = asyncio.get_running_loop()
    groups: list[str] = []
    gid_of: dict[str, int] = {}
    sink = (array("f"), array("H"), array("l"))
    stats = {"missed": 0, "recovered": 0, "resync_required": 0, "messages": 0, "stale": 0,
             "other": 0, "connected": 0, "failed": 0}
    conns: list[tuple[int, _FleetClient]] = []

    async def one(index, group, path, token, gate):
        port = ports[index % len(ports)]
        gid = gid_of.setdefault(group, len(gid_of))
        if gid == len(groups):
            groups.append(group)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   f"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1\r\n"
                   + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")
        try:
            async with gate:
                _, proto = await loop.create_connection(
                    lambda: _FleetClient(stats, sink, gid, measure_from), "127.0.0.1", port)
                proto.transport.write(request.encode())
                await asyncio.wait_for(proto.opened, 120)
        except Exception:
            stats["failed"] += 1
            return
        stats["connected"] += 1
        conns.append((gid, proto))

    gate = asyncio.Semaphore(32)
    await asyncio.gather(*(one(*spec, gate) for spec in specs))
    while any(p.last is None for _, p in conns) and not stop_at.value:
        await asyncio.sleep(0.1)  # every first snapshot in
    started.release()
    while not (stop_at.value and time.time() >= stop_at.value):
        await asyncio.sleep(0.2)
    ends = [(gid, p.first or 0, p.last or 0) for gid, p in conns]
    for _, proto in conns:
        proto.transport.write(b"\x88\x82\0\0\0\0\x03\xe8")  # close 1000 (masked)
    await asyncio.sleep(0.5)
    for _, proto in conns:
        proto.transport.close()
    out.put({"groups": groups, "ends": ends, "sink": sink, "cpu": cpu_seconds(), **stats})


def plan(args, slugs, users, keys) -> list[tuple[int, str, str, str | None]]:
    """Each connection's (index, group, path, token), shuffled so that every client
    process and web process gets the same mix."""
    rng = random.Random(7)
    n_me = min(len(users), round(args.clients * args.me))
    n_summary = round(args.clients * args.summary)
    n_market = args.clients - n_me - n_summary
    specs = [(f"user.{users[i]}", "/ws/me/", keys[i]) for i in range(n_me)]
    specs += [("summary", "/ws/summary/", None)] * n_summary
    w = weights(len(slugs))
    for _ in range(n_market):
        slug = rng.choices(slugs, w)[0]
        specs.append((f"market.{slug}", f"/ws/markets/{slug}/", None))
    rng.shuffle(specs)
    return [(i, *spec) for i, spec in enumerate(specs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10000)
    parser.add_argument("--web", type=int, default=2, help="uvicorn processes")
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--markets", type=int, default=4, choices=range(1, len(DUMPS) + 1))
    parser.add_argument("--me", type=float, default=0.25, help="share of /ws/me/ clients")
    parser.add_argument("--summary", type=float, default=0.10,
                        help="share of /ws/summary/ clients")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100, help="book changes per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--port", type=int, default=25000)
    parser.add_argument("--profile", default="",
                        help="a sampling profile of each web process: <this>.<port>.txt")
    parser.add_argument("--no-coalesce", action="store_true",
                        help="one socket write per frame (FEED_COALESCE_WRITES off)")
    parser.add_argument("--db", default="gpumarket_feedfleet")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5?socket_timeout=30")
    args = parser.parse_args()
    nofile = raise_nofile()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    env = bench_env(args)
    prepare(args, env)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ctx.Pool(1) as pool:
        seeded = pool.apply(seed, (env, args.markets, max(1, round(args.clients * args.me))))
    slugs, users = seeded["slugs"], seeded["users"]
    ports = [args.port + i for i in range(args.web)]
    servers = []
    counts = Path(tempfile.mkdtemp(prefix="feedfleet"))
    for port in ports:
        server_env = {**env, "FEED_BENCH_COUNTS": str(counts / f"{port}.txt"),
                      "FEED_BENCH_COALESCE": "0" if args.no_coalesce else "1"}
        if args.profile:
            server_env["FEED_BENCH_SAMPLE"] = str(Path(f"{args.profile}.{port}.txt").resolve())
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench.feed_asgi:application", "--host",
             "127.0.0.1", "--port", str(port), "--ws", "websockets-sansio", "--log-level",
             "warning", "--no-access-log"], cwd=ROOT, env=server_env))
    try:
        for port in ports:
            wait_port(port, 60)
        specs = plan(args, slugs, users, seeded["keys"])
        stop_at, measure_from = ctx.Value("d", 0.0), ctx.Value("d", 0.0)
        start_at = ctx.Value("d", float("inf"))
        started = ctx.Semaphore(0)
        procs = [ctx.Process(target=clients, args=(specs[i::args.client_procs], ports,
                                                   stop_at, measure_from, started, out))
                 for i in range(args.client_procs)]
        t0 = time.time()
        for p in procs:
            p.start()
        for _ in procs:
            started.acquire()
        connect_s = time.time() - t0
        print(f"{len(specs)} clients connected (snapshots in) in {connect_s:.1f} s",
              flush=True)
        per = args.rate / args.publishers
        pubs = [ctx.Process(target=publisher, args=(env, slugs, users, per, args.seconds,
                                                    args.warmup, i, start_at, out))
                for i in range(args.publishers)]
        for p in pubs:
            p.start()
        time.sleep(4)  # the publishers import Django
        web0 = [cpu_seconds(s.pid) for s in servers]
        busy0, wall0 = machine_busy(), time.time()
        start_at.value = time.time() + 0.5
        measure_from.value = start_at.value + args.warmup
        results = [out.get() for _ in pubs]
        stop_at.value = time.time() + 5  # the tail
        results += [out.get() for _ in procs]
        busy, wall = machine_busy() - busy0, time.time() - wall0
        web = [cpu_seconds(s.pid) - c for s, c in zip(servers, web0, strict=True)]
        for p in procs + pubs:
            p.join()
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            try:
                s.wait(15)
            except subprocess.TimeoutExpired:
                s.kill()
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    frames = writes = 0
    for port in ports:
        path = counts / f"{port}.txt"
        if path.exists():
            f, w = path.read_text().split()
            frames, writes = frames + int(f), writes + int(w)
    print(f"direct frames {frames} in {writes} socket writes "
          f"({frames / max(writes, 1):.2f} frames a write)")
    report(args, results, slugs, connect_s, web, wall, busy, load_before, load_after, nofile)


def report(args, results, slugs, connect_s, web, wall, busy, load_before, load_after,
           nofile) -> None:
    import redis

    pubs = [r for r in results if "changes" in r]
    cls = [r for r in results if "sink" in r]
    delays: dict[tuple[str, int], float] = {}
    for r in pubs:
        delays.update(r["delays"])
    conn = redis.Redis.from_url(args.redis)
    groups = sorted({g for r in cls for g in r["groups"]})
    finals = dict(zip(groups, (int(v or 0) for v in conn.mget(
        [f"gpumarket:feed:seq:{g}" for g in groups])), strict=True)) if groups else {}
    e2e, lat, undated = array("d"), array("d"), 0
    per_kind: dict[str, array] = {}
    expected = not_received = 0
    for r in cls:
        names = r["groups"]
        for gid, first, last in r["ends"]:
            final = finals.get(names[gid], 0)
            expected += max(0, final - first)
            not_received += max(0, final - last)
        for x, gid, seq in zip(*r["sink"], strict=True):
            group = names[gid]
            lat.append(x)
            d = delays.get((group, seq))
            if d is None:
                undated += 1
                continue
            e2e.append(x + d)
            per_kind.setdefault(group.split(".", 1)[0], array("d")).append(x + d)
    tot = {k: sum(r[k] for r in cls) for k in ("missed", "recovered", "resync_required",
                                                "messages", "stale", "other", "connected",
                                                "failed")}
    changes = sum(r["changes"] for r in pubs)
    elapsed = max(r["elapsed"] for r in pubs)
    ms = lambda v: f"{v * 1000:.1f}"  # noqa: E731
    writes = "one write per frame" if args.no_coalesce else "coalesced writes"
    print(f"feed fleet bench ({writes}): {args.clients} clients ({args.me:.0%} /ws/me/, "
          f"{args.summary:.0%} /ws/summary/, the rest on {len(slugs)} markets {slugs}) in "
          f"{args.client_procs} client processes, {args.web} uvicorn processes, "
          f"{args.publishers} publisher(s); Redis {args.redis}, PostgreSQL {args.db}; "
          f"{os.cpu_count()} CPUs; ulimit -n {nofile}; load average before "
          f"{' '.join(load_before)}, after {' '.join(load_after)}")
    print(f"connected {tot['connected']} (failed {tot['failed']}) in {connect_s:.1f} s; "
          f"book changes {changes} in {elapsed:.1f} s ({changes / elapsed:.0f}/s)")
    print(f"delivered {tot['messages']} messages (expected {expected}: every seq after "
          f"each client's first snapshot), {tot['messages'] / max(elapsed, 1e-9):.0f}/s")
    print(f"end to end (receive - commit), {len(e2e)} messages after the warm-up: p50 "
          f"{ms(pct(e2e, 50))} ms, p99 {ms(pct(e2e, 99))} ms, max "
          f"{ms(max(e2e, default=float('nan')))} ms; receive - ts p50 {ms(pct(lat, 50))}, "
          f"p99 {ms(pct(lat, 99))} ms; {undated} without a commit time")
    for kind, values in sorted(per_kind.items()):
        print(f"  {kind}: {len(values)} messages, p50 {ms(pct(values, 50))} ms, p99 "
              f"{ms(pct(values, 99))} ms")
    print(f"missed (gaps) {tot['missed']}, recovered by resync {tot['recovered']}, server "
          f"resync_required {tot['resync_required']}, not received by the end "
          f"{not_received}, stale/duplicate {tot['stale']}, other {tot['other']}")
    print(f"web CPU from the first change to the end of the tail: "
          f"{' + '.join(f'{c:.1f}' for c in web)} s in {wall:.1f} s ({sum(web) / wall:.2f} "
          f"cores); per delivered message {sum(web) / max(tot['messages'], 1) * 1e6:.1f} µs; "
          f"machine {busy / wall:.2f} of {os.cpu_count()} cores busy; client CPU "
          f"{sum(r['cpu'] for r in cls):.1f} s (whole run, connects included), publishers "
          f"{sum(r['cpu'] for r in pubs):.1f} s (whole run)")


if __name__ == "__main__":
    main()
