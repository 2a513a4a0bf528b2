"""Sealed-bid clearing benchmark: 100,000 and 1,000,000 bids, best of 5 (ms).

Bids (seeded): prices normal around 2_490_000 micro-USD per GPU-hour (sigma 300_000,
10_000 tick, floor one tick), 1-8 GPUs with a random minimum, seq with ties; lot of 64
GPUs, reserve 2_000_000 (so some bids are ineligible). A worst-case line re-runs
uniform_price with every bid's minimum above the lot, forcing a full ranking and walk.
The DESIGN.md target is < 150 ms for 100,000 bids under uniform_price in the core.
Bid construction is not timed.

--db: a sealed close through the database instead (PostgreSQL, a fresh database per
size): one provider's node of 8 H100s, an auction of its 8 GPUs (uniform_price, 1 h),
N funded bidders each placing one bid through marketplace.auctions.place_sealed_bid
(holds through the ledger; not timed), then `close_auction` timed: wall, this process's
CPU, SQL statements (Django's cursor and core.bulk's server-side ones), and a
ledger_check after. Target (DESIGN.md): 10,000 bids < 2 s.

Run:  .venv/bin/python bench/sealed.py [--sizes 100000 1000000] [--repeat 5] [--seed 1]
      .venv/bin/python bench/sealed.py --db [--sizes 100 1000 10000]
          [--db-name gpumarket_bench_sealed] [--pg postgres://postgres@127.0.0.1:5432]
          [--analyze] [--bulk-setup] [--template gpumarket_bench_sealed_tpl]
      (BENCH_PROFILE_CLOSE=<file>: a cProfile of the close)
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketplace.engine import SealedBid, clear

LOT = 64
RESERVE = 2_000_000


def make_bids(n: int, seed: int) -> list[SealedBid]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpus = rng.randint(1, 8)
        price = max(10_000, round(rng.gauss(2_490_000, 300_000) / 10_000) * 10_000)
        out.append(
            SealedBid(
                i,
                rng.randrange(n // 4 + 1),
                price,
                gpus,
                rng.randint(1, gpus),
                rng.randrange(n // 2 + 1),
            )
        )
    return out


def best_ms(rule: str, bids: list[SealedBid], repeat: int) -> tuple[float, int | None]:
    best = float("inf")
    price = None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter_ns()
            c = clear(rule, bids, lot_gpus=LOT, reserve=RESERVE)
            dt = time.perf_counter_ns() - t0
        finally:
            gc.enable()
        best = min(best, dt / 1e6)
        price = c.clearing_price
    return best, price


def db_close(n: int, seed: int, pg: str, name: str, analyze: bool, bulk: bool = False,
             template: str = "", setup_only: bool = False) -> None:
    """Set up N sealed bids on a fresh database, then time close_auction (see --db).
    template: set up once into that database (kept), then clone it (CREATE DATABASE …
    TEMPLATE) for the close; setup_only: set up into `name` and stop."""
    import os
    import subprocess

    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.api_orders import (
        drop_bench_database,
        fresh_database,
        mark_bench_database,
        server_env,
    )

    root = Path(__file__).resolve().parent.parent
    if template and not setup_only:
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            have = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                [template]).fetchone()
        if not have:
            subprocess.run([sys.executable, __file__, "--db-one", str(n), "--seed", str(seed),
                            "--pg", pg, "--db-name", template, "--setup-only",
                            *(["--bulk-setup"] if bulk else [])], check=True)
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            drop_bench_database(conn, name)
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            mark_bench_database(conn, name)
        env = server_env(f"{pg}/{name}")
    else:
        env = server_env(fresh_database(pg, name))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, env=env,
                       check=True)
    os.environ.update(env)
    import django

    django.setup()
    from datetime import timedelta

    from django.db import connection

    from core import bulk as core_bulk
    from marketplace.auctions import close_auction
    from marketplace.models import Auction, Lease, SealedBid
    from settlement.checks import first_violation

    if template and not setup_only:
        auction = Auction.objects.get()
        now = auction.closes_at - timedelta(days=1)
        print(f"setup: cloned from {template} "
              f"({SealedBid.objects.filter(auction=auction).count()} sealed bids)")
    else:
        auction, now = _db_setup(n, seed, bulk)
        if setup_only:
            return
    if analyze:
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    statements = [0]
    slow: list[tuple[float, str]] = []

    def count(run, sql, *a):
        statements[0] += 1
        t = time.perf_counter()
        try:
            return run(sql, *a)
        finally:
            slow.append((time.perf_counter() - t, sql[:150]))

    real = core_bulk.execute_arrays

    def counted(connection, sql, params):
        statements[0] += 1
        t = time.perf_counter()
        try:
            return real(connection, sql, params)
        finally:
            slow.append((time.perf_counter() - t, sql[:150]))

    print(f"load average before: {os.getloadavg()}")
    core_bulk.execute_arrays = counted
    for mod in list(sys.modules):
        if mod.split(".")[0] in ("settlement", "core", "marketplace", "webhooks") and \
                getattr(sys.modules[mod], "execute_arrays", None) is real:
            sys.modules[mod].execute_arrays = counted
    commit = [0.0]
    real_commit = connection._commit

    def timed_commit():  # the COMMIT apart: deferred FK checks run there
        t = time.perf_counter()
        try:
            return real_commit()
        finally:
            commit[0] += time.perf_counter() - t

    connection._commit = timed_commit
    prof = None
    if os.environ.get("BENCH_PROFILE_CLOSE"):
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]

    def backend_cpu() -> float | None:  # utime + stime of this connection's backend, s
        try:
            fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # PostgreSQL on another host
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    pg0 = backend_cpu()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with connection.execute_wrapper(count):
        closed = close_auction(auction_id=auction.pk, now=now + timedelta(days=1, seconds=1))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    pg1 = backend_cpu()
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["BENCH_PROFILE_CLOSE"])
    connection._commit = real_commit
    print(f"load average after: {os.getloadavg()}")
    won = SealedBid.objects.filter(auction=auction, status="won").count()
    lost = SealedBid.objects.filter(auction=auction, status="lost").count()
    print(f"{n:>7,} bids: close_auction {wall * 1000:8.1f} ms wall, {cpu * 1000:7.1f} ms CPU "
          f"(bench process), "
          f"{'?' if pg0 is None else f'{(pg1 - pg0) * 1000:.0f}'} ms CPU (PostgreSQL backend), "
          f"{statements[0]} SQL statements; {won} won, {lost} lost, "
          f"{Lease.objects.filter(sealed_bid__auction=auction).count()} leases, clearing "
          f"price {closed.clearing_price}; ledger_check: {first_violation() or 'clean'}")
    total = sum(dt for dt, _ in slow)
    print(f"    {total * 1000:8.1f} ms in statements, {commit[0] * 1000:.1f} ms in COMMIT")
    for dt, sql in sorted(slow, reverse=True)[:6]:
        print(f"    {dt * 1000:8.1f} ms  {sql}")


def _db_setup(n: int, seed: int, bulk: bool):
    """Provider, node, auction, N funded bidders and their bids (see --db, --bulk-setup);
    returns (auction, now)."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from core.bulk import insert_all
    from marketplace.auctions import open_auction, place_sealed_bid
    from marketplace.book import checked_hold_amount
    from marketplace.models import SealedBid as BidRow
    from marketplace.sealing import seal
    from settlement import services as ledger
    from settlement.models import JournalEntry
    from tests.factories import registered_node

    t0 = time.perf_counter()
    provider, node, _ = registered_node(name="bench-sealed")
    now = timezone.now()
    auction = open_auction(provider_id=provider.pk, node_id=node.pk, gpus=LOT_DB,
                           reserve_price=RESERVE, duration_seconds=3600,
                           closes_at=now + timedelta(days=1), rule="uniform_price")
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"bench-bidder-{i}", password="!") for i in range(n)])
    with transaction.atomic():  # funding, as dev_credit writes it, in one go
        source = ledger.account(ledger.Kind.EXTERNAL_DEV_CREDIT)
        keys = [(ledger.Kind.BUYER_AVAILABLE, u.pk) for u in users]
        locked = ledger.lock_accounts_creating(
            keys + [(ledger.Kind.BUYER_HELD, u.pk) for u in users])  # as first holds make
        ledger._write_entries([ledger._Entry(JournalEntry.Kind.DEV_CREDIT,
                                             [(source.pk, -10**10), (locked[k][0], 10**10)],
                                             "development credit", f"user:{k[1]}")
                               for k in keys])
    rng = random.Random(seed)
    draws = []
    for u in users:
        gpus = rng.randint(1, LOT_DB)
        price = max(RESERVE, round(rng.gauss(2_490_000, 300_000) / 10_000) * 10_000)
        draws.append((u, price, gpus, rng.randint(1, gpus)))
    if bulk:  # the rows place_sealed_bid writes, in chunks of 1,000 (holds_place_many)
        for i in range(0, n, 1000):
            chunk = draws[i:i + 1000]
            with transaction.atomic():
                holds = ledger.holds_place_many([
                    (u.pk, checked_hold_amount(price=p, gpus=g, duration_seconds=3600),
                     f"auction:{auction.pk}") for u, p, g, _ in chunk])
                insert_all([BidRow(auction=auction, bidder_id=u.pk, price=p, gpus=g,
                                   min_gpus=m, image="busybox", command=["true"], ports=[],
                                   port_roles={}, env={}, secrets_sealed=seal({}),
                                   checkpoint={}, hold_id=h.pk)
                            for (u, p, g, m), h in zip(chunk, holds, strict=True)])
    else:
        for u, price, gpus, min_gpus in draws:
            place_sealed_bid(bidder_id=u.pk, auction_id=auction.pk, price=price, gpus=gpus,
                             min_gpus=min_gpus, image="busybox", command=["true"],
                             now=now + timedelta(seconds=1))
    print(f"setup: {n} sealed bids placed in {time.perf_counter() - t0:.0f} s"
          f"{' (bulk)' if bulk else ''}")
    return auction, now


LOT_DB = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--db", action="store_true", help="a sealed close through PostgreSQL")
    ap.add_argument("--db-name", default="gpumarket_bench_sealed")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--analyze", action="store_true",
                    help="--db: ANALYZE after the setup, before the close")
    ap.add_argument("--bulk-setup", action="store_true",
                    help="--db: write the bids' rows in chunks (holds_place_many), not "
                         "one place_sealed_bid each (10,000 take 800-1,400 s here)")
    ap.add_argument("--template", default="",
                    help="--db: set up once into this database (kept) and clone it for "
                         "each close; drop it to set up again")
    ap.add_argument("--db-one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.db_one:
        db_close(args.db_one, args.seed, args.pg, args.db_name, args.analyze,
                 args.bulk_setup, args.template, args.setup_only)
        return
    if args.db:  # one process per size: each drops and creates its database
        import subprocess

        for n in args.sizes or [100, 1_000, 10_000]:
            subprocess.run([sys.executable, __file__, "--db-one", str(n), "--seed",
                            str(args.seed), "--pg", args.pg, "--db-name", args.db_name,
                            *(["--analyze"] if args.analyze else []),
                            *(["--bulk-setup"] if args.bulk_setup else []),
                            *(["--template", f"{args.template}_{n}"] if args.template
                              else [])],
                           check=True)
        return
    args.sizes = args.sizes or [100_000, 1_000_000]
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"lot {LOT} GPUs, reserve {RESERVE}, best of {args.repeat}"
    )
    for n in args.sizes:
        bids = make_bids(n, args.seed)
        for rule in ("uniform_price", "first_price", "second_price"):
            ms, price = best_ms(rule, bids, args.repeat)
            print(f"{n:>9,} bids  {rule:14s} {ms:8.1f} ms   clearing price {price}")
        # Worst case: every minimum exceeds the lot, so the walk ranks and visits all bids.
        deep = [SealedBid(b.id, b.owner, b.price, LOT + 1, LOT + 1, b.seq) for b in bids]
        ms, price = best_ms("uniform_price", deep, args.repeat)
        print(f"{n:>9,} bids  uniform_price  {ms:8.1f} ms   (worst case: full walk, no winner)")


if __name__ == "__main__":
    main()
