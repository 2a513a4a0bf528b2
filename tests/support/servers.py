"""The real ASGI application (marketplace.asgi: pages, API, websockets) under uvicorn, in a
thread of the test process, on 127.0.0.1 and the test database: `with AsgiServer() as
server:` → `server.url`; `stop()` and `start()` again restart it on the same port."""

from __future__ import annotations

import threading

import uvicorn
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
