"""The hour boundary: N running leases end within one minute; the worker settles them.

Setup (not timed): a fresh database (dropped, created, migrated), N/8 provider nodes of
8 H100s (recorded nvidia-smi dump, own GPU UUIDs), each offered by a standing ask; 10
funded buyers place N one-GPU bids (book.place_bids, 200 a call) that fill them. The
leases are then made running with their ends_at spread over the last minute, all past
GPUMARKET_LEASE_GRACE_SECONDS (an UPDATE: the clock as mark_running sets it). --resting
bids (1 GPU, at the asks' price) rest in the book, so returned GPUs re-match.

Timed: a real Celery worker (--pool solo, Redis broker) runs the beat's task
marketplace.tasks.end_overdue_leases once; the clock runs from the task's send until
every lease is ended. Lateness of a lease = when a poll (every 0.25 s) first saw it
ended - the send. Then ledger_check, and
the counts of GPUs back on their asks and of new leases for the resting bids.
--inproc --batch B runs the sweep in this process instead (B=1: one lease per transaction);
--meter times one metering run (meter_running_leases) over the running leases instead
(BENCH_PROFILE=FILE: under cProfile, into FILE, for --inproc and --meter).
N above 200 (a multiple of 200): one block of 200 leases is set up as above, then
bench/replicate.py copies it in SQL (one INSERT per table), so 10,000 and 100,000 leases
can be set up in minutes; ANALYZE after the setup.

Run:  .venv/bin/python bench/lease_ends.py [--leases 10000] [--resting 100] [--inproc | --meter]
          [--batch 20] [--db gpumarket_bench_ends] [--pg postgres://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, server_env  # noqa: E402

PRICE = 2_490_000
MARKET = "h100-sxm-80gb"


BLOCK = 200  # leases set up through the services; larger N: copies of that block


def _place(reqs) -> None:
    from marketplace import book

    for start in range(0, len(reqs), 200):
        for placed in book.place_bids(reqs[start:start + 200]):
            if isinstance(placed, Exception):
                raise placed


def set_up(n: int, resting: int) -> int:
    """N running leases (N <= BLOCK, or a multiple of BLOCK: one block through the
    services, then bench/replicate.py's copies of it), then the resting bids."""
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from bench.replicate import replicate
    from marketplace import book
    from settlement import services as ledger
    from tests.factories import UserFactory, registered_node

    if n > BLOCK and n % BLOCK:
        raise SystemExit(f"--leases above {BLOCK} must be a multiple of {BLOCK}")
    block = min(n, BLOCK)
    t0 = time.perf_counter()
    for i in range((block + 7) // 8):
        user, node, _ = registered_node(name=f"bench-{i + 1}", own_uuids=True)
        book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=None, price=PRICE,
                       gpus=8, available_until=timezone.now() + timedelta(days=2))
    buyers = [UserFactory() for _ in range(10)]
    for b in buyers:
        ledger.dev_credit(user_id=b.pk, amount=10**12)
    _place([book.BidRequest(buyer_id=buyers[i % 10].pk, market_slug=MARKET, price=PRICE,
                            gpus=1, duration_seconds=3600) for i in range(block)])
    t1 = time.perf_counter()
    if n > block:
        counts = replicate(n // block - 1)
        print(f"setup: block of {block} leases through the services {t1 - t0:.0f} s; "
              f"{n // block - 1} copies in {time.perf_counter() - t1:.0f} s: "
              + ", ".join(f"{t.split('_', 1)[1]} {c}" for t, c in counts.items()))
    _place([book.BidRequest(buyer_id=buyers[i % 10].pk, market_slug=MARKET, price=PRICE,
                            gpus=1, duration_seconds=3600) for i in range(resting)])
    grace = settings.GPUMARKET_LEASE_GRACE_SECONDS
    with connection.cursor() as cur:  # running, ends_at spread over the last minute
        cur.execute(
            "UPDATE marketplace_lease SET status = 'running', container_id = repeat('b', 64),"
            " ends_at = now() - make_interval(secs => %s + 1 + (id %% 60)),"
            " started_at = now() - make_interval(secs => %s + 1 + (id %% 60) + 3600)",
            [grace, grace])
        cur.execute("SELECT count(*) FROM marketplace_lease WHERE status = 'running'")
        running = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM providers_node")
        nodes = cur.fetchone()[0]
        cur.execute("ANALYZE")
    print(f"setup: {running} running leases on {nodes} nodes, {resting} resting bids,"
          f" {time.perf_counter() - t0:.0f} s")
    return running


def ended_count() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM marketplace_lease WHERE status = 'completed'")
        return cur.fetchone()[0]


def watch(n: int, sent: float, done) -> list[float]:
    """Poll every 0.25 s until `done()`: lease k's lateness is the first poll that saw k
    leases ended (the sweep's `settled_at` is its start, not the commit)."""
    late: list[float] = []
    while True:
        finished = done()
        seen = ended_count()
        late += [time.time() - sent] * (seen - len(late))
        if finished or len(late) >= n:
            return late
        time.sleep(0.25)


def report(n: int, late: list[float], wall: float) -> None:
    from django.db import connection

    from settlement.checks import first_violation

    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(sum(remaining_gpus), 0) FROM marketplace_order"
                    " WHERE side = 'ask'")
        back = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM marketplace_lease WHERE status <> 'completed'")
        new = cur.fetchone()[0]
    p = (lambda q: float(late[min(len(late) - 1, int(q * len(late)))])) if late else None
    print(f"ended {len(late)}/{n} in {wall:.1f} s; lateness p50 {p(0.5):.1f} s, "
          f"p99 {p(0.99):.1f} s, max {late[-1]:.1f} s" if late else "ended none")
    print(f"GPUs back on asks (remaining): {back}; new leases for resting bids: {new}; "
          f"ledger_check: {first_violation() or 'clean'}")


def meter(n: int, batch: dict) -> None:
    """Time one metering run (leases.meter_running_leases) over the N running leases, in
    this process: every lease has run its first whole period (started_at over an hour
    ago), so each is charged once; a second run must charge none. `batch`: leases per
    transaction ({} for METER_BATCH). Prints wall, this process's CPU, the PostgreSQL
    backend's CPU (/proc: same machine), and the wall of each kind of statement."""
    from django.db import connection

    from core import bulk as core_bulk
    from marketplace.leases import meter_running_leases
    from settlement.checks import first_violation
    from settlement.models import JournalEntry

    statements: list[tuple[str, float]] = []  # (the statement's first words, wall s)
    real = core_bulk.execute_arrays

    def timed(label, run, *a):
        t = time.perf_counter()
        try:
            return run(*a)
        finally:
            statements.append((re.sub(r'"s\d+_x\d+"', "…", " ".join(label.split()[:4]))[:60],
                               time.perf_counter() - t))

    def counted(connection_, sql, params):  # core.bulk's server-side statements count too
        return timed(sql, real, connection_, sql, params)

    for mod in list(sys.modules.values()):  # every module that took execute_arrays by name
        if getattr(mod, "execute_arrays", None) is real:
            mod.execute_arrays = counted
    commit = connection.commit
    connection.commit = lambda: timed("COMMIT (deferred foreign keys)", commit)
    with connection.cursor() as cur:  # PostgreSQL runs here: its backend's CPU, read in /proc
        cur.execute("SELECT pg_backend_pid()")
        backend = Path(f"/proc/{cur.fetchone()[0]}/stat")

    def pg_cpu() -> float:  # utime + stime of the backend, seconds
        fields = backend.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wal() -> int:  # bytes of WAL written so far (the whole server's)
        with connection.cursor() as cur:
            cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            return cur.fetchone()[0]

    wal_before = wal()
    pg, cpu, wall = pg_cpu(), time.process_time(), time.perf_counter()
    with connection.execute_wrapper(lambda run, sql, *a: timed(sql, run, sql, *a)):
        if os.environ.get("BENCH_PROFILE"):  # cProfile of the run into that file
            import cProfile

            with cProfile.Profile() as prof:
                charged = meter_running_leases(**batch)
            prof.dump_stats(os.environ["BENCH_PROFILE"])
        else:
            charged = meter_running_leases(**batch)
    cpu, wall, pg = time.process_time() - cpu, time.perf_counter() - wall, pg_cpu() - pg
    measured = statements[:]  # the timed run's; not the second run's
    wal_bytes = wal() - wal_before
    again = meter_running_leases()
    print(f"metering: {len(charged)}/{n} leases charged in {wall:.2f} s wall, {cpu:.2f} s CPU"
          f" ({wall * 1000 / max(1, n):.2f} ms wall, {cpu * 1000 / max(1, n):.2f} ms CPU per "
          f"lease; PostgreSQL backend {pg:.2f} s CPU, {pg * 1000 / max(1, n):.2f} ms per "
          f"lease; WAL {wal_bytes / 2**20:.0f} MiB, {wal_bytes / max(1, n):.0f} B per lease "
          f"(the server's)), {sum(not label.startswith('COMMIT') for label, _ in measured)} SQL "
          f"statements and {sum(label.startswith('COMMIT') for label, _ in measured)} "
          f"commits; second run charged {len(again)}; "
          f"{JournalEntry.objects.filter(kind='lease_meter').count()} lease_meter entries; "
          f"ledger_check: {first_violation() or 'clean'}")
    print(f"load average after: {os.getloadavg()}")
    by: dict[str, list[float]] = {}
    for label, seconds in measured:
        by.setdefault(label, []).append(seconds)
    for label, times in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(times):7.2f} s wall in {len(times):5d} × {label}")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat, Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leases", type=int, default=10_000)
    ap.add_argument("--resting", type=int, default=100)
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--meter", action="store_true",
                    help="time meter_running_leases over the running leases instead")
    ap.add_argument("--batch", type=int, default=None,
                    help="leases per batch (default: GPUMARKET_LEASE_END_BATCH; with --meter "
                         "leases.METER_BATCH; for the worker run, set the variable instead)")
    ap.add_argument("--db", default="gpumarket_bench_ends")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    args = ap.parse_args()
    url = fresh_database(args.pg, args.db)
    env = server_env(url)
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)
    n = set_up(args.leases, args.resting)
    print(f"load average before: {os.getloadavg()}")
    if args.meter:
        meter(n, {"batch": args.batch} if args.batch else {})
        return
    if args.inproc:
        from marketplace.lease_end import end_overdue_leases

        sent = time.time()
        if os.environ.get("BENCH_PROFILE"):
            import cProfile

            cProfile.runctx("end_overdue_leases(batch=args.batch)", globals(), locals(),
                            os.environ["BENCH_PROFILE"])
        else:
            from django.db import connection

            from core import bulk as core_bulk

            statements = []
            real = core_bulk.execute_arrays

            def counted(*a):  # core.bulk's server-side statements count too
                statements.append(1)
                return real(*a)

            for mod in ("core.bulk", "settlement.services", "marketplace.book"):
                sys.modules[mod].execute_arrays = counted
            cpu = time.process_time()
            with connection.execute_wrapper(lambda run, sql, *a: (statements.append(1),
                                                                  run(sql, *a))[1]):
                end_overdue_leases(**({"batch": args.batch} if args.batch else {}))
            cpu = time.process_time() - cpu
            print(f"batch {args.batch}: {len(statements)} SQL statements, "
                  f"{len(statements) / max(1, ended_count()):.1f} per lease; "
                  f"{cpu:.2f} s CPU of this process, "
                  f"{cpu * 1000 / max(1, ended_count()):.2f} ms per lease")
        wall = time.time() - sent
        report(n, [wall] * ended_count(), wall)  # in-process: no commit times
        print(f"load average after: {os.getloadavg()}")
        return
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "solo",
         "--loglevel", "WARNING"], cwd=ROOT, env=env)
    try:
        from marketplace.celery import app
        from marketplace.models import Lease

        time.sleep(8)  # the worker connects
        sent = time.time()
        app.signature("marketplace.tasks.end_overdue_leases").apply_async()
        cpu0 = _cpu_seconds(worker.pid)
        late = watch(n, sent, lambda: time.time() - sent > 1200)
        wall = late[-1] if late else time.time() - sent
        time.sleep(2)  # the re-match passes after the last commit
        cpu = _cpu_seconds(worker.pid) - cpu0
        assert not Lease.objects.filter(status="running").exists()
        report(n, late, wall)
        print(f"worker CPU {cpu:.2f} s ({cpu * 1000 / max(1, n):.2f} ms per lease), "
              f"GPUMARKET_LEASE_END_BATCH={os.environ.get('GPUMARKET_LEASE_END_BATCH', 200)}")
    finally:
        worker.terminate()
        worker.wait()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
