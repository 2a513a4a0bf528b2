"""Webhooks: what `webhooks.emit` adds to a service's transaction, and one worker's
delivery rate to a receiver on 127.0.0.1.

Setup (not timed): a fresh PostgreSQL database (dropped, created, migrated); users with
0, 1 and 3 endpoints taking `lease.started`; Celery's in-memory broker (the after-commit
task messages go nowhere: delivery is timed separately); a receiver (http.server, a
thread per request, answering 200 at once) on 127.0.0.1.

Timed: `--events` emits per user, each in its own transaction (`transaction.atomic()` with
the emit alone, commit included), p50/p99 in µs; then `webhooks.delivery.deliver_due`
in this one process draining the 1-endpoint user's events (claim, sign, POST, record),
events/s.

    .venv/bin/python bench/webhooks.py [--events 2000] [--db gpumarket_bench_webhooks]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_orders import fresh_database, server_env  # noqa: E402


def receiver() -> tuple[ThreadingHTTPServer, list[int]]:
    got = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            got[0] += 1
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--db", default="gpumarket_bench_webhooks")
    ap.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    args = ap.parse_args()
    env = {**server_env(fresh_database(args.pg, args.db)), "CELERY_BROKER_URL": "memory://",
           "GPUMARKET_WEBHOOK_ALLOW_PRIVATE": "1", "GPUMARKET_DB_POOL": "0"}
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from webhooks import delivery, services
    from webhooks.events import emit
    from webhooks.models import WebhookDelivery

    server, got = receiver()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    users = {}
    for n in (0, 1, 3):
        user = get_user_model().objects.create(username=f"bench-{n}")
        for _ in range(n):
            services.create_endpoint(user_id=user.pk, url=url, events=["lease.started"])
        users[n] = user
    print(f"setup: {args.events} emits per user, PostgreSQL {args.pg}, python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    for n, user in users.items():
        times = []
        for i in range(args.events):
            t0 = time.perf_counter_ns()
            with transaction.atomic():
                emit(user.pk, "lease.started", {"lease": i, "status": "running"})
            times.append((time.perf_counter_ns() - t0) / 1000)
        print(f"emit, {n} endpoint(s): p50 {statistics.median(times):.0f} µs, "
              f"p99 {pct(times, 0.99):.0f} µs")
    endpoint = users[1].webhook_endpoints.get()
    t0 = time.perf_counter()
    while True:
        made, _more = delivery.deliver_due(endpoint.pk, limit=500)
        if made == 0:
            break
    dt = time.perf_counter() - t0
    delivered = WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").count()
    assert delivered == got[0] == args.events, (delivered, got[0])
    print(f"delivery, one process: {delivered} events in {dt:.2f} s = {delivered / dt:.0f}/s "
          f"(load average {os.getloadavg()[0]:.2f})")
    server.shutdown()


if __name__ == "__main__":
    main()
