"""Runner heartbeats at fleet scale (issue 17): N nodes of 8 GPUs through the real HTTP
endpoint (uvicorn, one process, PostgreSQL), with the payload the runner sends.

Setup (not timed, bulk): a fresh database (dropped, created, migrated); N nodes of the
recorded 8 × H100 inventory (data/nvidia-smi/h100-80gb-hbm3-x8…), 50 nodes per provider,
each with its own runner token (only the SHA-256 stored, as node_create does), GPUs
bulk-created with per-node UUIDs, every node registered and heard just before the run.
`--leased` of the nodes run one lease of their 8 GPUs (Lease and LeaseGpu rows written
directly, hold id 0: this database is for the bench only), so their heartbeats carry
`telemetry` as the runner's does.

Body of each heartbeat (providers/runner/agent.py `heartbeat`): `runtime`, the 8
readings (nvml.PROTOCOL_KEYS) of the dump as DumpGpus reads them, the non-ok findings of
the real health rules on them (one `hw_power_brake` warn), and for a leased node its
lease's `telemetry` (runner/telemetry.py). `--vary power` (default) moves each GPU's
power_w (and a leased GPU's utilization) on every beat, as NVML's readings do; `--vary
none` sends the recorded readings unchanged, as `--simulate` does.

Load: `--mode max`: `--concurrency` raw keep-alive HTTP/1.1 clients, back to back, nodes
in turn, for `--seconds` (capacity); `--mode paced`: each node beats every `--interval`
seconds (phases spread evenly; offered rate N / interval), sent on the next free client,
latency from the send and lateness (send − due) reported. A warm-up of `--warmup` seconds
is sent first and not counted.

Figures: heartbeats/s, p50/p99 latency; web-process CPU ms per heartbeat (utime+stime of
the uvicorn process from /proc, over the timed phase) and PostgreSQL's (its backends of
this database); rows written per heartbeat (pg_stat_user_tables inserts/updates/deletes,
read after the server stopped, over every heartbeat sent); SQL statements per heartbeat
by kind from `--sample` beats through Django's test client in this process (the single
path: the DRF view and services; CaptureQueriesContext), and per beat of a group of
`--concurrency` beats through the heartbeat batcher in this process (BEGIN and COMMIT
counted), before the HTTP run; the server's beats per group from its /metrics
(gpumarket_heartbeat_group_size); this process's own CPU per beat (the clients share the
machine's cores with the server). `--workers`: uvicorn processes; `--profile PATH`: the
server under py-spy (--gil, collapsed stacks; its CPU figures then include py-spy's).

    .venv/bin/python bench/heartbeats.py --nodes 1000 [--mode max|paced] [--seconds 20]
        [--concurrency 16] [--leased 0.5] [--vary power|none] [--db gpumarket_hb_bench]
        [--port 21080] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, pct, server_env, server_pids  # noqa: E402

DUMP = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
PATH = "/api/v1/runner/heartbeat/"
NODES_PER_PROVIDER = 50
TABLES = ("providers_node", "providers_gpu", "marketplace_leasesample")


def uuid_of(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * 8 + gpu:012x}"


def recorded():
    """(inventory GPUs as the runner reports them, their readings, non-ok findings)."""
    from providers.runner.health import evaluate
    from providers.runner.nvml import PROTOCOL_KEYS, DumpGpus

    source = DumpGpus(DUMP)
    inv = source.inventory()
    readings = source.sample_health([g.uuid for g in inv.gpus])
    findings = [f.as_protocol() for f in evaluate(readings) if f.severity != "ok"]
    gpus = [{k: r.get(k) for k in PROTOCOL_KEYS} for r in readings]
    return inv, gpus, readings, findings


def set_up(n: int, leased: float, seed: int) -> list[dict]:
    """Bulk-create the fleet; returns per node {"token", "uuids", "lease"}."""
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from marketplace.models import GpuClass, Lease, LeaseGpu
    from providers.models import Gpu, Node, Provider, hash_token

    User = get_user_model()
    inv, _g, _r, _f = recorded()
    h100 = GpuClass.objects.get(slug=inv.gpus[0].gpu_class)
    rng = random.Random(seed)
    now = timezone.now()
    out: list[dict] = []
    with transaction.atomic():
        providers = []
        owners = User.objects.bulk_create(
            [User(username=f"bench-provider-{i}", password="!")
             for i in range(-(-n // NODES_PER_PROVIDER))])
        providers = Provider.objects.bulk_create(
            [Provider(user=u, display_name=f"Bench {i}") for i, u in enumerate(owners)])
        buyer = User.objects.create(username="bench-buyer", password="!")
        nodes = []
        for i in range(n):
            token = f"gmr_bench{seed}_{i}_{rng.getrandbits(64):016x}"
            out.append({"token": token, "uuids": [uuid_of(i, k) for k in range(8)],
                        "lease": None})
            nodes.append(Node(provider=providers[i // NODES_PER_PROVIDER], name=f"node-{i}",
                              token_hash=hash_token(token), hostname=f"node-{i}",
                              driver_version=inv.driver_version,
                              cuda_version=inv.cuda_version, runner_version="bench",
                              inventory_source="simulate:" + DUMP.name, runtime="docker",
                              registered_at=now, last_heartbeat_at=now))
        nodes = Node.objects.bulk_create(nodes, batch_size=2000)
        gpus = []
        for i, node in enumerate(nodes):
            for k, g in enumerate(inv.gpus):
                gpus.append(Gpu(node=node, uuid=uuid_of(i, k), gpu_class=h100,
                                product_name=g.product_name, memory_mib=g.memory_mib,
                                pci_bus_id=g.pci_bus_id, mig_mode=g.mig_mode or ""))
        gpus = Gpu.objects.bulk_create(gpus, batch_size=4000)
        chosen = rng.sample(range(n), round(n * leased))
        leases = Lease.objects.bulk_create(
            [Lease(market=h100, buyer=buyer, provider=owners[i // NODES_PER_PROVIDER],
                   node=nodes[i], status=Lease.Status.RUNNING, price=2_000_000, gpu_count=8,
                   duration_seconds=86400, image="bench", hold_id=0, started_at=now,
                   ends_at=now + timedelta(days=1)) for i in chosen], batch_size=2000)
        LeaseGpu.objects.bulk_create(
            [LeaseGpu(lease=lease, gpu=gpus[i * 8 + k])
             for lease, i in zip(leases, chosen, strict=True) for k in range(8)],
            batch_size=4000)
        for lease, i in zip(leases, chosen, strict=True):
            out[i]["lease"] = lease.pk
    return out


def bodies_for(node: dict, vary: str, rng: random.Random, template) -> dict:
    """One heartbeat body of `node` (module docstring)."""
    _inv, gpus, readings, findings = template
    by_dump = {r["uuid"]: u for r, u in zip(readings, node["uuids"], strict=True)}
    items = []
    for g in gpus:
        item = {**g, "uuid": by_dump[g["uuid"]]}
        if vary == "power":
            item["power_w"] = round(item["power_w"] + rng.uniform(-4, 4), 2)
            if node["lease"]:
                item["utilization_pct"] = rng.randrange(80, 101)
        items.append(item)
    body = {"runtime": "docker", "gpus": items,
            "findings": [{**f, "uuid": by_dump[f["uuid"]]} for f in findings]}
    if node["lease"]:
        from providers.runner.telemetry import lease_telemetry

        merged = [{**r, **i} for r, i in zip(readings, items, strict=True)]
        body["telemetry"] = lease_telemetry(merged, {node["lease"]: node["uuids"]},
                                            {node["lease"]})
    return body


class Conn:
    """A minimal HTTP/1.1 keep-alive client (as bench/api_orders.py's RawClient), with the
    runner's Bearer token per request."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader = self.writer = None

    async def post(self, token: str, data: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            .encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(x.split(":", 1)[1]) for x in lines[1:]
                      if x.lower().startswith("content-length:"))
        return int(lines[0].split(" ", 2)[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def cpu_ms(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), in ms."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total * 1000 / tick


def backends(pg_url: str, db: str) -> list[int]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (db,))]


def table_writes(pg_url: str) -> dict[str, tuple[int, int, int]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables")}


def settled_writes(pg_url: str) -> dict[str, tuple[int, int, int]]:
    """table_writes once two reads 0.5 s apart agree (backends report as they exit)."""
    last = table_writes(pg_url)
    for _ in range(40):
        time.sleep(0.5)
        now = table_writes(pg_url)
        if now == last:
            return now
        last = now
    return last


async def drive(port: int, nodes: list[dict], make_body, *, mode: str, seconds: float,
                concurrency: int, interval: float, warmup: float, on_timed=None):
    """Returns (latencies s, lateness s, codes, elapsed s, beats sent in all)."""
    conns = [Conn(port) for _ in range(concurrency)]
    lat: list[float] = []
    late: list[float] = []
    codes: Counter = Counter()
    sent = 0
    state = {"timing": False}

    async def one(conn: Conn, i: int, due: float | None) -> None:
        nonlocal sent
        data = json.dumps(make_body(i)).encode()
        t0 = time.perf_counter()
        status, answer = await conn.post(nodes[i]["token"], data)
        sent += 1
        if status != 200 or b"telemetry_errors" in answer:
            raise SystemExit(f"heartbeat answered {status}: {answer[:300]!r}")
        if state["timing"]:
            lat.append(time.perf_counter() - t0)
            codes[status] += 1
            if due is not None:
                late.append(max(0.0, t0 - due))

    start = time.perf_counter()
    end_warm = start + warmup
    end = end_warm + seconds

    def tick() -> None:
        if not state["timing"] and time.perf_counter() >= end_warm:
            state["timing"] = True
            state["t0"] = time.perf_counter()
            if on_timed:
                on_timed()

    if mode == "max":
        turn = iter(range(10**12))

        async def loop(conn: Conn) -> None:
            while time.perf_counter() < end:
                tick()
                await one(conn, next(turn) % len(nodes), None)

        await asyncio.gather(*(loop(c) for c in conns))
    else:
        queue: asyncio.Queue = asyncio.Queue()

        async def worker(conn: Conn) -> None:
            while True:
                i, due = await queue.get()
                try:
                    tick()
                    await one(conn, i, due)
                finally:
                    queue.task_done()

        tasks = [asyncio.create_task(worker(c)) for c in conns]
        step = interval / len(nodes)
        k = 0
        while True:
            due = start + k * step
            if due >= end:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.put_nowait((k % len(nodes), due))
            k += 1
        await queue.join()
        for t in tasks:
            t.cancel()
    elapsed = time.perf_counter() - state.get("t0", start)
    for c in conns:
        c.close()
    return lat, late, codes, elapsed, sent


def statements(nodes: list[dict], make_body, beats: int) -> tuple[Counter, int]:
    """SQL statements per heartbeat by kind, `beats` beats through the ASGI app here."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    kinds: Counter = Counter()
    for n in range(beats):
        i = n % len(nodes)
        with CaptureQueriesContext(connection) as seen:
            r = client.post(PATH, json.dumps(make_body(i)), content_type="application/json",
                            HTTP_AUTHORIZATION=f"Bearer {nodes[i]['token']}")
        assert r.status_code == 200, r.content
        for q in seen.captured_queries:
            kinds[q["sql"].lstrip().split(None, 1)[0].upper()] += 1
    return kinds, beats


def group_statements(nodes: list[dict], make_body, size: int, groups: int) -> float:
    """SQL statements per heartbeat through the heartbeat batcher (heartbeat_batch.py), in
    this process: `groups` groups of `size` beats of distinct nodes, as the server's
    batcher writes what arrived together (BEGIN and COMMIT counted)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from marketplace.api import heartbeat_batch
    from marketplace.api.heartbeat_path import lean_heartbeat

    batcher = heartbeat_batch.HeartbeatBatcher(256)
    count = 0
    for g in range(groups):
        picked = [(g * size + k) % len(nodes) for k in range(size)]
        group = [heartbeat_batch._Pending(nodes[i]["token"], lean_heartbeat(make_body(i)),
                                          "bench", None, None) for i in picked]
        with CaptureQueriesContext(connection) as seen:
            outcomes = batcher._outcomes(group)
        assert all(o[0] == 200 for o in outcomes), outcomes[:3]
        count += len(seen.captured_queries) + 2  # the transaction's BEGIN and COMMIT
    return count / (size * groups)


def scrape_groups(port: int) -> tuple[float, float]:
    """(heartbeats, groups) the server's batchers wrote, from its /metrics."""
    import httpx

    found = {"_sum": 0.0, "_count": 0.0}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text.splitlines():
        for suffix in found:
            if line.startswith("gpumarket_heartbeat_group_size" + suffix):
                found[suffix] += float(line.rsplit(" ", 1)[1])
    return found["_sum"], found["_count"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--mode", choices=["max", "paced"], default="max")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--leased", type=float, default=0.5,
                    help="share of the nodes with a running lease (telemetry)")
    ap.add_argument("--vary", choices=["power", "none"], default="power")
    ap.add_argument("--sample", type=int, default=200,
                    help="beats counted for statements, in this process")
    ap.add_argument("--db", default="gpumarket_hb_bench")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    ap.add_argument("--port", type=int, default=21080)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1, help="uvicorn web processes")
    ap.add_argument("--profile", metavar="PATH",
                    help="run the server under py-spy, collapsed stacks to PATH (its CPU "
                         "figures then include py-spy's)")
    args = ap.parse_args()

    load0 = Path("/proc/loadavg").read_text().split()[:3]
    database_url = fresh_database(args.pg, args.db)
    env = server_env(database_url)
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    t0 = time.perf_counter()
    nodes = set_up(args.nodes, args.leased, args.seed)
    setup_s = time.perf_counter() - t0
    template = recorded()
    rng = random.Random(args.seed)

    def make_body(i: int) -> dict:
        return bodies_for(nodes[i], args.vary, rng, template)

    from django.db import connections
    from django.utils import timezone

    from providers.models import Node

    Node.objects.update(last_heartbeat_at=timezone.now())  # every node heard just now
    kinds, sampled = statements(nodes, make_body, args.sample)
    Node.objects.update(last_heartbeat_at=timezone.now())
    grouped = group_statements(nodes, make_body, min(args.concurrency, len(nodes)),
                               max(1, args.sample // args.concurrency))
    Node.objects.update(last_heartbeat_at=timezone.now())
    connections.close_all()
    getattr(connections["default"], "close_pool", lambda: None)()  # backends report on exit
    before = settled_writes(database_url)

    env = {**env, "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-hb-metrics-")}
    spy = ([str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "--gil",
            "-f", "raw", "-o", args.profile, "--subprocesses", "--"] if args.profile else [])
    server = subprocess.Popen(
        [*spy, sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
         "127.0.0.1", "--port", str(args.port), "--workers", str(args.workers),
         "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env)
    try:
        for _ in range(150):
            try:
                with __import__("socket").create_connection(("127.0.0.1", args.port), 0.2):
                    break
            except OSError:
                time.sleep(0.2)
        marks: dict = {}

        def on_timed() -> None:
            marks["pids"] = backends(database_url, args.db)
            marks["web"] = server_pids(server.pid)
            marks["web0"], marks["pg0"] = cpu_ms(marks["web"]), cpu_ms(marks["pids"])
            marks["groups0"] = scrape_groups(args.port)
            marks["client0"] = time.process_time()

        lat, late, codes, elapsed, sent = asyncio.run(drive(
            args.port, nodes, make_body, mode=args.mode, seconds=args.seconds,
            concurrency=args.concurrency, interval=args.interval, warmup=args.warmup,
            on_timed=on_timed))
        client = (time.process_time() - marks["client0"]) * 1000
        web = cpu_ms(marks["web"]) - marks["web0"]
        pg = cpu_ms(marks["pids"]) - marks["pg0"]
        beats1, groups1 = scrape_groups(args.port)
        group_size = ((beats1 - marks["groups0"][0]) / max(1.0, groups1 - marks["groups0"][1]))
    finally:
        for pid in server_pids(server.pid)[1:] if args.profile else []:
            os.kill(pid, signal.SIGTERM)  # uvicorn under py-spy: py-spy writes as it ends
        if not args.profile:
            server.terminate()
        server.wait(timeout=60)
    after = settled_writes(database_url)
    done = len(lat)
    rows = {t: [a - b for a, b in zip(after.get(t, (0, 0, 0)), before.get(t, (0, 0, 0)),
                                  strict=True)]
            for t in TABLES}
    all_rows = sum(sum(a) - sum(before.get(t, (0, 0, 0))) for t, a in after.items())
    ms = sorted(x * 1000 for x in lat)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    leased = sum(1 for n in nodes if n["lease"])
    print(f"setup: {args.nodes} nodes × 8 GPUs ({leased} leased) in {setup_s:.1f} s; "
          f"mode {args.mode}, {args.concurrency} clients, vary {args.vary}; python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; load average "
          f"{' '.join(load0)} → {' '.join(load1)}")
    offered = f", offered {args.nodes / args.interval:,.0f}/s" if args.mode == "paced" else ""
    print(f"heartbeats {done} in {elapsed:.1f} s: {done / elapsed:,.0f}/s{offered}; "
          f"p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, max {ms[-1]:.1f} ms; "
          f"status {dict(codes)}")
    if late:
        lt = sorted(x * 1000 for x in late)
        print(f"lateness (send − due): p50 {pct(lt, 50):.1f} ms, p99 {pct(lt, 99):.1f} ms")
    print(f"CPU per heartbeat: web process {web / done:.2f} ms, PostgreSQL backends "
          f"{pg / done:.2f} ms ({len(marks['pids'])} backends); this bench's clients "
          f"{client / done:.2f} ms (bodies, HTTP; the same 2 cores)")
    print(f"heartbeat groups over HTTP: {group_size:.1f} beats per group; statements per "
          f"heartbeat in groups of {min(args.concurrency, len(nodes))} (in process): "
          f"{grouped:.2f}; uvicorn workers {args.workers}")
    print(f"statements per heartbeat alone ({sampled} in process, the DRF view): "
          f"{sum(kinds.values()) / sampled:.2f} = "
          + ", ".join(f"{k} {v / sampled:.2f}" for k, v in kinds.most_common()))
    print(f"rows written per heartbeat ({sent} sent over HTTP): {all_rows / sent:.2f} in all; "
          + ", ".join(f"{t} ins/upd/del {'/'.join(f'{x / sent:.2f}' for x in v)}"
                      for t, v in rows.items()))


if __name__ == "__main__":
    main()
