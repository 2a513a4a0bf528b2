"""`make demo`: the whole job on recorded real input, as one process group.

Migrates the database (a fresh SQLite file under var/demo/ each run unless
DATABASE_URL is set), starts the ASGI server
(uvicorn, 127.0.0.1:8000), a Celery worker with beat, and two runners in
`--simulate` mode on the recorded 8 × H100 and 8 × RTX 4090 hosts
(data/nvidia-smi/), then plays a scenario through the REST API and prints each
step: provider onboarded, GPUs registered, asks and bids, a sealed auction closed,
leases started in containers and ended, and the ledger's 85/15 split.

Leases last a few seconds so the whole flow is visible. With DEMO_ONESHOT=1 it
exits 0 after the report; otherwise it keeps serving http://127.0.0.1:8000 until
Ctrl-C, which stops every process.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "nvidia-smi"
HOSTS = {
    "h100-node-1": DATA / "h100-80gb-hbm3-x8.driver-535.183.01.txt",
    "rtx4090-node-1": DATA / "rtx-4090-x8.driver-535.154.05.txt",
}
IMAGE = "gpumarket/busybox:local"
LEASE_SECONDS = int(os.environ.get("DEMO_LEASE_SECONDS", "6"))


def say(step: str, text: str) -> None:
    print(f"[demo] {step:<18} {text}", flush=True)


class Demo:
    def __init__(self) -> None:
        self.port = int(os.environ.get("DEMO_PORT", "8000"))
        self.base = f"http://127.0.0.1:{self.port}"
        self.var = Path(os.environ.get("GPUMARKET_VAR_DIR", ROOT / "var"))
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "marketplace.settings",
                    "GPUMARKET_DEV_CREDIT": "1", "PYTHONUNBUFFERED": "1",
                    "GPUMARKET_VAR_DIR": str(self.var)}
        # the scenario's own signups must not use up a person's signups on this machine
        self.env.setdefault("GPUMARKET_SIGNUP_RATE", "100/hour")
        # the demo's metrics start from zero with its fresh database (core/metrics.py)
        self.metrics_dir = self.var / "demo" / "prometheus"
        self.env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        if "DATABASE_URL" not in os.environ:
            # The scenario registers the recorded hosts' GPU UUIDs, which are unique: each
            # run starts from its own fresh SQLite file so that it can run again.
            self.db_file = self.var / "demo" / "gpumarket-demo.sqlite3"
            self.env["DATABASE_URL"] = f"sqlite:///{self.db_file}"
        else:
            self.db_file = None
        self.http = httpx.Client(base_url=self.base, timeout=30)
        self.tokens: dict[str, str] = {}
        self.node_uids: list[str] = []

    # -- processes ---------------------------------------------------------------
    def spawn(self, name: str, args: list[str], log: bool = False) -> subprocess.Popen:
        logfile = open(self.var / "demo" / f"{name}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env,
                                stdout=None if log else logfile,
                                stderr=subprocess.STDOUT if not log else None)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self.remove_containers()

    def remove_containers(self) -> None:
        """The runners leave running leases' containers for re-adoption when they stop;
        the demo's own nodes go away with it, so their containers do too."""
        if not self.node_uids:
            return
        try:
            import docker

            client = docker.from_env(timeout=5)
            for uid in self.node_uids:
                for c in client.containers.list(all=True,
                                                filters={"label": f"gpumarket.node={uid}"}):
                    c.remove(force=True)
                    say("cleanup", f"removed container {c.short_id} of lease "
                        f"{c.labels.get('gpumarket.lease')}")
        except Exception:  # no Docker: the process runtime's children ended with the runners
            return

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None and proc.returncode != 0:
                raise SystemExit(f"[demo] a process exited early: {' '.join(proc.args[:4])} "
                                 f"(status {proc.returncode}); see {self.var / 'demo'}")

    # -- HTTP helpers ------------------------------------------------------------
    def call(self, method: str, path: str, who: str | None = None, **kwargs) -> dict:
        headers = {"Authorization": f"Token {self.tokens[who]}"} if who else {}
        r = self.http.request(method, path, headers=headers, **kwargs)
        if r.status_code >= 400:
            raise SystemExit(f"[demo] {method} {path} failed: {r.status_code} {r.text[:300]}")
        return r.json()

    def wait_for(self, what: str, check, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            result = check()
            if result:
                return result
            time.sleep(0.3)
        raise SystemExit(f"[demo] timed out waiting for {what}")

    # -- the scenario ------------------------------------------------------------
    def runtime(self) -> str:
        try:
            import docker

            client = docker.from_env(timeout=5)
            client.ping()
        except Exception:
            say("runtime", "no Docker Engine answers: the runners are started with "
                "--runtime process (local processes; never chosen by `auto`)")
            return "process"
        try:
            client.images.get(IMAGE)
        except Exception:
            build = ROOT / "scripts" / "build-test-image.sh"
            if shutil.which("busybox") and subprocess.run([str(build), IMAGE]).returncode == 0:
                say("runtime", f"built local image {IMAGE}")
            else:
                say("runtime", f"Docker answers but {IMAGE} is missing and cannot be built: "
                    "using the local process runtime")
                return "process"
        say("runtime", f"Docker Engine answers: leases run as containers of {IMAGE}")
        return "docker"

    def run(self) -> int:
        (self.var / "demo").mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir()
        py = sys.executable
        if self.db_file is not None:
            self.db_file.unlink(missing_ok=True)
            say("database", f"migrating a fresh SQLite database {self.db_file}")
        else:
            say("database", "migrating " + self.env["DATABASE_URL"].split("@")[-1])
        if not self._port_free():
            raise SystemExit(f"[demo] port {self.port} on 127.0.0.1 is in use: stop what "
                             "listens there or choose another with DEMO_PORT=8001")
        subprocess.run([py, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                       env=self.env, check=True)
        runtime = self.runtime()
        say("web", f"starting the ASGI server on {self.base}")
        self.spawn("web", [py, "-m", "uvicorn", "marketplace.asgi:application", "--host",
                           "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
                           # uvicorn would take X-Forwarded-For from any local process as
                           # the client (login limits, the /metrics allowlist): no proxy here
                           "--no-proxy-headers"])
        say("worker", "starting a Celery worker with beat")
        self.spawn("worker", [py, "-m", "celery", "-A", "marketplace", "worker", "--beat",
                              "--pool", "solo", "--loglevel", "INFO", "-s",
                              str(self.var / "demo" / "celerybeat-schedule")])
        self.wait_for("the web server", self._web_up, timeout=60)

        stamp = datetime.now(UTC).strftime("%H%M%S")
        users = {"provider": f"acme-{stamp}", "alice": f"alice-{stamp}",
                 "bob": f"bob-{stamp}", "carol": f"carol-{stamp}"}
        for who, username in users.items():
            body = self.call("POST", "/api/v1/signup/",
                             # any password the validators take: the demo uses the token
                             json={"username": username, "password": secrets.token_urlsafe(18)})
            self.tokens[who] = body["token"]
        self.call("POST", "/api/v1/providers/", "provider",
                  json={"display_name": "Acme GPU Cloud"})
        say("provider", f"onboarded: Acme GPU Cloud (user {users['provider']})")

        nodes = {}
        for name, dump in HOSTS.items():
            node = self.call("POST", "/api/v1/nodes/", "provider", json={"name": name})
            self.node_uids.append(node["uid"])
            state = self.var / "demo" / f"runner-{name}"
            shutil.rmtree(state, ignore_errors=True)
            reg = subprocess.run(
                [py, "-m", "providers.runner", "register", "--url", self.base, "--token",
                 node["runner_token"], "--simulate", str(dump), "--state-dir", str(state)],
                cwd=ROOT, env=self.env, capture_output=True, text=True)
            if reg.returncode != 0:
                hint = (" (the recorded GPUs are already registered in this DATABASE_URL by an "
                        "earlier run: use a fresh database)" if "409" in reg.stderr else "")
                raise SystemExit(f"[demo] runner register failed: {reg.stderr.strip()}{hint}")
            # Without Redis the channel layer is a SQLite file under var/ shared by web,
            # worker and beat (core/sqlite_layer.py): the worker's notices (a lease created
            # when it closes the auction) reach the runners' /ws/runner/ too.
            self.spawn(f"runner-{name}", [py, "-m", "providers.runner", "run", "--state-dir",
                                          str(state), "--heartbeat-interval", "2",
                                          "--runtime", runtime, "--network", "none"])
            nodes[name] = node["id"]
        # an ask or an auction needs a node whose runner was heard from (book.py)
        self.wait_for("a first heartbeat of every node", lambda: all(
            n["last_heartbeat_at"] for n in
            self.call("GET", "/api/v1/nodes/", "provider")["results"]), timeout=30)
        for node in self.call("GET", "/api/v1/nodes/", "provider")["results"]:
            models = {}
            for g in node["gpus"]:
                models.setdefault((g["product_name"], g["gpu_class"]), 0)
                models[(g["product_name"], g["gpu_class"])] += 1
            for (product, cls), n in models.items():
                say("gpus registered", f"{node['name']}: {n} × {product} ({cls}), driver "
                    f"{node['driver_version']}, CUDA {node['cuda_version']}")

        for who in ("alice", "bob", "carol"):
            self.call("POST", "/api/v1/wallet/dev-credit/", who, json={"amount": "500.00"})
        say("wallets", "alice, bob and carol credited 500.00 USD each (development credit)")

        classes = {c["slug"]: c for c in self.call("GET", "/api/v1/gpu-classes/")["results"]}
        h100_ref = Decimal(classes["h100-sxm-80gb"]["reference_price"])
        rtx_ref = Decimal(classes["rtx-4090"]["reference_price"])
        until = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        ask_price = "2.49"  # Lambda's on-demand H100 list price, data/reference-prices.csv
        ask = self.call("POST", "/api/v1/orders/", "provider", json={
            "side": "ask", "node": nodes["h100-node-1"], "gpus": 4, "price": ask_price,
            "available_until": until})
        say("ask", f"Acme offers 4 × h100-sxm-80gb at {ask_price} USD/GPU-h (reference "
            f"{h100_ref:.2f}) — order {ask['id']}")
        low = self.call("POST", "/api/v1/orders/", "bob", json={
            "side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 2, "price": "2.11",
            "duration_seconds": LEASE_SECONDS, "image": IMAGE, "command": ["sleep", "3600"]})
        say("bid", f"bob bids 2 × h100-sxm-80gb at 2.11 USD/GPU-h: rests ({low['status']})")
        bid = self.call("POST", "/api/v1/orders/", "alice", json={
            "side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 2, "price": "2.60",
            "duration_seconds": LEASE_SECONDS, "image": IMAGE, "command": ["sleep", "3600"]})
        say("fill", f"alice bids 2 × h100-sxm-80gb at 2.60 → {bid['status']} at the ask's "
            f"{ask_price}; lease {bid['leases']} ({LEASE_SECONDS} s, billed per second)")
        book = self.call("GET", "/api/v1/gpu-classes/h100-sxm-80gb/book/")
        say("order book", "h100-sxm-80gb bids " + _levels(book["bids"]) + " | asks "
            + _levels(book["asks"]))

        closes = datetime.now(UTC) + timedelta(seconds=4)
        auction = self.call("POST", "/api/v1/auctions/", "provider", json={
            "node": nodes["rtx4090-node-1"], "gpus": 8, "reserve_price": "1.10",
            "rule": "second_price", "duration_seconds": LEASE_SECONDS,
            "closes_at": closes.isoformat()})
        say("auction", f"sealed second-price auction {auction['id']}: 8 × rtx-4090, reserve "
            f"1.10 USD/GPU-h (reference {rtx_ref:.2f}), closes in 4 s")
        for who, price in (("alice", "1.30"), ("bob", "1.45"), ("carol", "1.20")):
            self.call("POST", f"/api/v1/auctions/{auction['id']}/bids/", who, json={
                "price": price, "image": IMAGE, "command": ["sleep", "3600"]})
            say("sealed bid", f"{who} bids {price} USD/GPU-h (sealed)")
        public = self.call("GET", f"/api/v1/auctions/{auction['id']}/")
        say("auction", f"public view before close: {public['bid_count']} bids, "
            f"{public['seconds_left']} s left (no prices shown)")
        closed = self.wait_for("the auction to close", lambda: self._closed(auction["id"]), 60)
        # public awards name nobody: each bidder finds its own award among its sealed bids
        winner_name = next((who for who in ("alice", "bob", "carol")
                            if self._won(who, auction["id"])), "nobody")
        say("auction closed", f"winner {winner_name}, clearing price "
            f"{closed['clearing_price']} USD/GPU-h (second-highest bid)")

        lease_ids = bid["leases"] + [lease["id"] for lease in self.call(
            "GET", "/api/v1/leases/", "provider")["results"] if lease["id"] not in bid["leases"]]
        for lease_id in sorted(set(lease_ids)):
            lease = self.wait_for(f"lease {lease_id} to run",
                                  lambda i=lease_id: self._lease(i, ("running", "completed")))
            handle = lease["container_id"]
            where = f"process {handle}" if handle.startswith("pid-") else \
                f"container {handle[:12]}"
            say("lease started", f"lease {lease_id}: {lease['gpu_count']} × "
                f"{lease['gpu_class']} in {where}")
        for lease_id in sorted(set(lease_ids)):
            lease = self.wait_for(f"lease {lease_id} to end",
                                  lambda i=lease_id: self._lease(i, ("completed", "failed")),
                                  timeout=LEASE_SECONDS + 60)
            say("lease ended", f"lease {lease_id}: {lease['status']} ({lease['cause']})")
            say("ledger split", f"lease {lease_id}: cost {lease['cost']} USD = provider "
                f"{lease['provider_amount']} (85 %) + platform {lease['platform_fee']} (15 %)")
        self.report_gpu_health()
        wallet = self.call("GET", "/api/v1/wallet/", "provider")
        say("provider earned", f"Acme GPU Cloud: {wallet['earned']} USD")
        for who in ("alice", "bob", "carol"):
            w = self.call("GET", "/api/v1/wallet/", who)
            say("buyer wallet", f"{who}: available {w['available']} USD, held {w['held']} USD")
        check = subprocess.run([py, "manage.py", "ledger_check"], cwd=ROOT, env=self.env,
                               capture_output=True, text=True)
        verdict = check.stdout.strip().splitlines()[-1] if check.returncode == 0 else \
            check.stderr.strip()
        say("ledger check", verdict)
        if check.returncode != 0:
            return 1
        say("done", "scenario complete")
        return 0

    def report_gpu_health(self) -> None:
        """After the leases ended: wait for a heartbeat of every node, then say how many of
        its GPUs are healthy, the warnings by rule, and each unhealthy GPU's finding (a GPU
        still held after a lease would show here: providers/runner/gpu_processes.py)."""
        after = datetime.now(UTC)

        def beaten():
            nodes = self.call("GET", "/api/v1/nodes/", "provider")["results"]
            return nodes if all(n["last_heartbeat_at"] and datetime.fromisoformat(
                n["last_heartbeat_at"].replace("Z", "+00:00")) > after for n in nodes) else None

        for node in self.wait_for("a heartbeat of every node", beaten, timeout=30):
            gpus = node["gpus"]
            warnings: dict[str, int] = {}
            fatal = []
            for gpu in gpus:
                for f in gpu["findings"]:
                    if f["severity"] == "warn":
                        warnings[f["rule"]] = warnings.get(f["rule"], 0) + 1
                    else:
                        fatal.append(f"{gpu['uuid']} {f['rule']}: {f['evidence']}")
            healthy = sum(1 for g in gpus if g["healthy"])
            text = f"{node['name']}: {healthy} of {len(gpus)} GPUs healthy"
            if warnings:
                text += "; warnings: " + ", ".join(f"{r} ×{n}" for r, n in sorted(
                    warnings.items()))
            say("gpu health", text + "".join(f"; unhealthy: {f}" for f in fatal))

    def _port_free(self) -> bool:
        import socket

        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            try:
                s.bind(("127.0.0.1", self.port))
            except OSError:
                return False
        return True

    def _web_up(self) -> bool:
        try:
            return self.http.get("/api/v1/gpu-classes/").status_code == 200
        except httpx.HTTPError:
            return False

    def _closed(self, auction_id: int):
        body = self.call("GET", f"/api/v1/auctions/{auction_id}/")
        return body if body["status"] == "closed" else None

    def _lease(self, lease_id: int, statuses: tuple[str, ...]):
        body = self.call("GET", f"/api/v1/leases/{lease_id}/", "provider")
        return body if body["status"] in statuses else None

    def _won(self, who: str, auction_id: int) -> bool:
        mine = self.call("GET", "/api/v1/sealed-bids/", who)["results"]
        return any(b["auction"] == auction_id and b["status"] == "won" for b in mine)


def _levels(levels: list[dict]) -> str:
    return ", ".join(f"{lv['gpus']}@{lv['price']}" for lv in levels) or "(empty)"


def main() -> int:
    demo = Demo()
    oneshot = os.environ.get("DEMO_ONESHOT") == "1"
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Explicit handlers: a shell that starts us in the background ignores SIGINT otherwise.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        status = demo.run()
        if oneshot or status != 0:
            return status
        say("serving", f"browse {demo.base}/ and {demo.base}/api/docs/ — press Ctrl-C to "
            "stop every process")
        while True:
            demo.check_alive()
            time.sleep(1)
    except KeyboardInterrupt:
        say("stopping", "Ctrl-C: stopping the web server, worker and runners")
        return 0
    finally:
        demo.stop_all()


if __name__ == "__main__":
    sys.exit(main())
