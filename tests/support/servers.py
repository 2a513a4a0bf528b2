"""The real ASGI application (marketplace.asgi: pages, API, websockets) under uvicorn, in a
thread of the test process, on 127.0.0.1 and the test database: `with AsgiServer() as
server:` → `server.url`; `stop()` and `start()` again restart it on the same port.
`SeenRequests(path)` counts the requests a server in this process (AsgiServer or
pytest-django's live_server) starts for a path: something to wait on, not a sleep."""

from __future__ import annotations

import threading

import uvicorn
from django.core.signals import request_started
from django.db import connections

from marketplace.asgi import application
from tests.support.net import free_port
from tests.support.waiting import wait_until


class AsgiServer:
    """`port` (a free one by default); `config`: more uvicorn.Config keywords (e.g.
    ws="websockets-sansio"). `start()` returns once uvicorn listens (15 s or fail);
    `stop()` returns once its thread has ended (or after 10 s)."""

    def __init__(self, port: int | None = None, **config) -> None:
        self.port = port or free_port()
        self.config = {"log_level": "warning", "lifespan": "off", **config}
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AsgiServer:
        self.server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1",
                                                    port=self.port, **self.config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until("uvicorn to start", lambda: self.server.started, timeout=15, every=0.05)
        return self

    def stop(self, timeout: float = 10) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout)

    def __enter__(self) -> AsgiServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        connections.close_all()  # the server thread's connections, before the db teardown


class SeenRequests:
    """`with SeenRequests("/api/v1/runner/leases/") as seen:` → `seen.count`, the requests
    for exactly that path that Django's handlers in this process started meanwhile (WSGI
    and ASGI alike: the request_started signal)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._lock = threading.Lock()

    def _started(self, sender, environ=None, scope=None, **kwargs) -> None:
        path = (environ or {}).get("PATH_INFO") or (scope or {}).get("path")
        if path == self.path:
            with self._lock:
                self.count += 1

    def __enter__(self) -> SeenRequests:
        request_started.connect(self._started, weak=False)
        return self

    def __exit__(self, *exc) -> None:
        request_started.disconnect(self._started)
