"""A webhook receiver for tests: http.server in a thread on 127.0.0.1 that verifies each
request's Gpumarket-Signature with the endpoint's secret (webhooks/signing.py), and the
`receiver_factory` fixture (import it where used)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.net import free_port
from webhooks import signing


class Receiver:
    """A webhook receiver on 127.0.0.1:`port`. `secret` set: each request's signature is
    checked. `answer` is the status it answers; `hang` (an Event) holds each request
    until it is set. `events` are the verified bodies, in arrival order."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.secret = ""
        self.answer = 200
        self.hang: threading.Event | None = None
        self.events: list[dict] = []
        self.bad_signatures = 0
        self.arrived = threading.Event()  # a request came in (even one still held)
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks?x=1"

    def ids(self) -> list[str]:
        return [e["id"] for e in self.events]

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrived.set()
                if receiver.hang is not None:
                    receiver.hang.wait(60)
                if signing.verify(receiver.secret, body,
                                  self.headers.get(signing.HEADER, "")):
                    receiver.events.append(json.loads(body))
                else:
                    receiver.bad_signatures += 1
                self.send_response(receiver.answer)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            if self.hang is not None:
                self.hang.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def receiver_factory():
    made: list[Receiver] = []

    def make(port: int | None = None, *, start: bool = True) -> Receiver:
        receiver = Receiver(port)
        made.append(receiver)
        return receiver.start() if start else receiver

    yield make
    for receiver in made:
        receiver.stop()
