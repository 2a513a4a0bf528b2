"""The ASGI lifespan of the web process: at startup, before it serves a request, each
market's book is loaded into the process's book cache (locking.warm_up), so that the
first bids after a start or a deploy do not rebuild a deep book under the market lock
(bench/README.md, "The book at depth"). GPUMARKET_BOOK_WARM_UP=0 skips it. A failure
is logged and the process serves anyway (the first writer then rebuilds)."""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings
from django.db import connections

log = logging.getLogger("gpumarket.market")


def _warm_up() -> None:
    from marketplace import locking

    started = time.monotonic()
    try:
        loaded = locking.warm_up()
    except Exception:
        log.exception("book cache warm-up failed; the first writer of each market rebuilds")
        return
    finally:
        connections.close_all()  # (this thread's connection)
    if loaded:
        log.info("book cache warmed: %d markets, %d resting orders, %.2f s", len(loaded),
                 sum(loaded.values()), time.monotonic() - started)


async def lifespan(scope, receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if getattr(settings, "GPUMARKET_BOOK_WARM_UP", True):
                await asyncio.to_thread(_warm_up)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
