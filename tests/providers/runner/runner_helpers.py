"""Helpers for the runner tests: recorded dump paths and a stand-in marketplace server."""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DUMPS = ROOT / "data" / "nvidia-smi"
H100 = DUMPS / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
RTX4090 = DUMPS / "rtx-4090-x8.driver-535.154.05.txt"
A10 = DUMPS / "a10-x1.driver-535.129.03.txt"
TITAN_V = DUMPS / "titan-v-x1.driver-560.35.03.txt"
TRUNCATED = DUMPS / "h100-80gb-hbm3-x8.truncated.txt"

TOKEN = "runner-token-for-tests-0123456789"


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class FakeMarketplace:
    """A stand-in for the marketplace's runner endpoints (docs/RUNNER_PROTOCOL.md),
    kept in memory and served by http.server on 127.0.0.1 in a thread.

    This is NOT the real server (the lead writes that in marketplace/); it exists so the
    runner's HTTP behaviour can be tested without Django. It checks the Bearer token
    (401 otherwise), records inventories, heartbeats and events, applies the lease state
    machine (pending → starting → running → completed | failed; illegal moves → 409),
    answers 503 to everything while `outage` is set,
    sets started_at/ends_at on `running`, and lists only pending/starting/running leases.
    """

    TRANSITIONS = {
        "pending": {"starting", "running", "failed"},
        "starting": {"starting", "running", "failed"},  # starting again: progress
        "running": {"completed", "failed"},
    }

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.node = {"id": random.randint(10**6, 10**7), "name": "test-node"}
        self.leases: dict[int, dict] = {}
        self.events: list[tuple[int, dict]] = []
        self.inventories: list[dict] = []
        self.heartbeats: list[dict] = []
        self.logs: dict[int, list[str]] = {}  # lease id → every tail received, in order
        self.checkpoints: dict[int, list[dict]] = {}  # lease id → checkpoint reports
        self.outage = False  # True: every call answers 503, as during a deploy
        self.wanted_images: list[str] = []  # GET /api/v1/runner/images/
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                if fake.outage:
                    return self._reply(503, {"detail": "down for maintenance"})
                if self.headers.get("Authorization") != f"Bearer {fake.token}":
                    return self._reply(401, {"detail": "Invalid runner token."})
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                with fake.lock:
                    status, answer = fake.route(method, self.path, body)
                self._reply(status, answer)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        if method == "POST" and path == "/api/v1/runner/inventory/":
            self.inventories.append(body)
            gpus = [{"uuid": g["uuid"], "gpu_class": g["gpu_class"]} for g in body["gpus"]]
            return 200, {"node": {**self.node, "gpus": gpus}}
        if method == "POST" and path == "/api/v1/runner/heartbeat/":
            self.heartbeats.append(body)
            return 200, {"server_time": iso(datetime.now(UTC))}
        if method == "GET" and path == "/api/v1/runner/images/":
            return 200, {"images": [{"image": i, "why": "template", "leases": 0}
                                    for i in self.wanted_images]}
        if method == "GET" and path == "/api/v1/runner/leases/":
            listed = [dict(lease) for lease in self.leases.values()
                      if lease["status"] in self.TRANSITIONS]
            return 200, {"leases": listed}
        prefix, suffix = "/api/v1/runner/leases/", "/logs/"
        if method == "POST" and path.startswith(prefix) and path.endswith(suffix):
            lease_id = int(path[len(prefix):-len(suffix)])
            if lease_id not in self.leases:
                return 404, {"detail": "No such lease."}
            tail = body.get("tail")
            if not isinstance(tail, str) or len(tail.encode()) > 64 * 1024 or "\x00" in tail:
                return 400, {"detail": "tail: must be text of at most 64 KiB, without NUL"}
            self.logs.setdefault(lease_id, []).append(tail)
            return 200, {"lease": lease_id, "tail": tail, "updated_at": iso(datetime.now(UTC))}
        suffix = "/checkpoints/"  # a report, also for an ended lease (as the marketplace)
        if method == "POST" and path.startswith(prefix) and path.endswith(suffix):
            lease_id = int(path[len(prefix):-len(suffix)])
            if lease_id not in self.leases:
                return 404, {"detail": "No such lease."}
            self.checkpoints.setdefault(lease_id, []).append(body)
            return 200, {"lease": lease_id, "checkpoints": self.checkpoints[lease_id]}
        suffix = "/events/"
        if method == "POST" and path.startswith(prefix) and path.endswith(suffix):
            lease = self.leases.get(int(path[len(prefix):-len(suffix)]))
            if lease is None:
                return 404, {"detail": "No such lease."}
            new = body.get("status")
            if new not in self.TRANSITIONS.get(lease["status"], set()):
                return 409, {"detail": f"lease is {lease['status']}, cannot become {new}"}
            self.events.append((lease["id"], body))
            lease["status"] = new
            if new == "running":
                now = datetime.now(UTC)
                lease["started_at"] = iso(now)
                lease["ends_at"] = iso(now + timedelta(seconds=lease["duration_seconds"]))
            return 200, dict(lease)
        return 404, {"detail": f"no route {method} {path}"}

    def add_lease(self, lease_id: int, gpu_uuids: list[str], *, image: str,
                  command: list[str], duration_seconds: int = 3600, **extra) -> dict:
        lease = {"id": lease_id, "status": "pending", "image": image, "command": command,
                 "gpu_uuids": gpu_uuids, "env": {"GPUMARKET_LEASE_ID": str(lease_id)},
                 "duration_seconds": duration_seconds, "started_at": None, "ends_at": None,
                 **extra}
        with self.lock:
            self.leases[lease_id] = lease
        return lease

    def events_for(self, lease_id: int) -> list[dict]:
        with self.lock:
            return [body for lid, body in self.events if lid == lease_id]


LEASE_UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9",
               "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"]


def lease_for(lease_id: int, image: str, command: list[str], uuids=LEASE_UUIDS) -> dict:
    """A lease as GET /api/v1/runner/leases/ lists it, pending, on two H100 GPUs."""
    return {"id": lease_id, "status": "pending", "image": image, "command": command,
            "gpu_uuids": list(uuids), "env": {"GPUMARKET_LEASE_ID": str(lease_id)},
            "duration_seconds": 60, "started_at": None, "ends_at": None}


def wait_for(predicate, timeout: float = 10.0):
    """Poll `predicate` until it returns something truthy (returned), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
