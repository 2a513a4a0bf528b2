"""The ASGI application bench/feed.py runs: `marketplace.asgi.application`, plus what the
bench needs to tell the server's share of the latency from the clients' share.

- FEED_BENCH_WRITES=<file>: for every depth/trade frame the server hands to the
  websocket (the ASGI `websocket.send` returned: uvicorn wrote it to the socket), record
  (message ts, time written) and write them to <file> (array of doubles) at exit. The
  clients' receive time minus this is time spent in the kernel and in the client
  processes (a client process that is short of CPU reads late).
- FEED_BENCH_COALESCE=0: one socket write per frame (FEED_COALESCE_WRITES off).
- FEED_BENCH_COUNTS=<file>: "frames writes" of the feed hubs' coalesced direct writes
  (frontend/feed/hub.py, `write_later`), written at exit.
- FEED_BENCH_SAMPLE=<file>: a sampling profiler (every 2 ms, the stack of every thread
  but its own) written as text to <file> at exit: where the server spends its time,
  without cProfile's per-call overhead distorting a workload of tiny calls.

The write times wrap ASGI `send`, so the feed's direct frame writes (frontend/
consumers.py) are off while they are recorded: that measures the ASGI path. The
sampler costs the GIL every 2 ms.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from array import array

from marketplace.asgi import application as inner

if os.environ.get("FEED_BENCH_COALESCE") == "0":  # the A/B of bench/feed_fleet.py
    from django.conf import settings

    settings.FEED_COALESCE_WRITES = False

_WRITES = os.environ.get("FEED_BENCH_WRITES", "")
_SAMPLE = os.environ.get("FEED_BENCH_SAMPLE", "")
_COUNTS = os.environ.get("FEED_BENCH_COUNTS", "")
_written = array("d")  # ts, written, ts, written, ...


def _record(message) -> None:
    text = message.get("text")
    if text and (text.startswith('{"type":"depth"') or text.startswith('{"type":"trade"')):
        _written.append(float(text[text.rindex('"ts":') + 5:-1]))
        _written.append(time.time())


async def _timed(scope, receive, send):
    if scope["type"] == "lifespan":  # uvicorn dies of its own re-raised SIGTERM: no atexit
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                _dump()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if not _WRITES or scope["type"] != "websocket":
        return await inner(scope, receive, send)

    async def timed_send(message):
        await send(message)
        if message["type"] == "websocket.send":
            _record(message)

    return await inner(scope, receive, timed_send)


application = _timed if (_WRITES or _SAMPLE or _COUNTS) else inner
_sampler: _Sampler | None = None


def _dump() -> None:
    if _WRITES:
        with open(_WRITES, "wb") as f:
            _written.tofile(f)
    if _sampler is not None:
        _sampler.dump()
    if _COUNTS:  # the hubs' coalesced direct writes: frames and socket writes
        from frontend import feed

        hubs = list(feed._hubs.values())
        with open(_COUNTS, "w") as f:
            f.write(f"{sum(h.frames for h in hubs)} {sum(h.writes for h in hubs)}\n")


class _Sampler(threading.Thread):
    def __init__(self, path: str, interval: float = 0.002) -> None:
        super().__init__(daemon=True, name="bench-sampler")
        self.path, self.interval = path, interval
        self.leaf: collections.Counter = collections.Counter()
        self.inclusive: collections.Counter = collections.Counter()
        self.samples = 0

    def run(self) -> None:
        me = threading.get_ident()
        while True:
            time.sleep(self.interval)
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                thread = names.get(tid, str(tid))
                stack = []
                while frame is not None:
                    code = frame.f_code
                    where = code.co_filename.split("site-packages/")[-1]
                    stack.append(f"{where}:{code.co_firstlineno}:{code.co_name}")
                    frame = frame.f_back
                self.samples += 1
                self.leaf[(thread, stack[0])] += 1
                for name in set(stack):
                    self.inclusive[(thread, name)] += 1

    def dump(self) -> None:
        with open(self.path, "w") as f:
            f.write(f"samples {self.samples} (all threads; a waiting thread is sampled too)\n")
            f.write("--- leaf frames\n")
            for (thread, name), n in self.leaf.most_common(60):
                f.write(f"{n:7d} {thread} {name}\n")
            f.write("--- inclusive\n")
            for (thread, name), n in self.inclusive.most_common(150):
                f.write(f"{n:7d} {thread} {name}\n")


if _SAMPLE:
    _sampler = _Sampler(_SAMPLE)
    _sampler.start()
