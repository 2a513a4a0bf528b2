"""The embedded default's channel layer (core/sqlite_layer.py) across two processes: the
delay from a group send in one process to its receive in another (p50, p99, max), at a
steady rate, and a burst's throughput. Prints its setup line. No Django settings needed.

    .venv/bin/python bench/sqlite_layer.py [--rate 50] [--seconds 10] [--burst 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.sqlite_layer import SQLiteChannelLayer

GROUP = "market.bench"


async def send(path: str, rate: float, seconds: float, burst: int) -> None:
    layer = SQLiteChannelLayer(path=path, capacity=burst + 100)  # (the sender's decides)
    n = int(rate * seconds)
    for i in range(n):
        await layer.group_send(GROUP, {"type": "feed.event", "i": i, "t": time.time()})
        await asyncio.sleep(1 / rate)
    # the burst: the publisher's way, batches of 50 group sends in one write
    for start in range(0, burst, 50):
        await layer.group_send_many([(GROUP, {"type": "feed.event", "i": -1, "t": time.time()})
                                     for _ in range(min(50, burst - start))])
    await layer.group_send(GROUP, {"type": "feed.event", "i": -2, "t": time.time()})


async def receive(path: str, rate: float, seconds: float, burst: int) -> None:
    layer = SQLiteChannelLayer(path=path, capacity=burst + 100)
    channel = await layer.new_channel("feedhub.")
    await layer.group_add(GROUP, channel)
    child = subprocess.Popen([sys.executable, __file__, "--child", path, "--rate", str(rate),
                              "--seconds", str(seconds), "--burst", str(burst)])
    delays, burst_start, got = [], None, 0
    while True:
        message = await layer.receive(channel)
        now = time.time()
        if message["i"] >= 0:
            delays.append((now - message["t"]) * 1000)
        elif message["i"] == -1:
            burst_start = burst_start or message["t"]
            got += 1
        else:
            break
    child.wait()
    delays.sort()
    p99 = delays[int(len(delays) * 0.99) - 1]
    print(f"steady {rate:g}/s for {seconds:g} s: {len(delays)} messages, delay p50 "
          f"{statistics.median(delays):.1f} ms, p99 {p99:.1f} ms, max {delays[-1]:.1f} ms")
    took = time.time() - burst_start
    print(f"burst: {got} messages sent and received in {took:.2f} s ({got / took:,.0f}/s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--burst", type=int, default=5000)
    args = parser.parse_args()
    if args.child:
        asyncio.run(send(args.child, args.rate, args.seconds, args.burst))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "channels.sqlite3")
        print(f"sqlite_layer: 2 processes, one file ({path}), poll interval 0.02 s, "
              f"load {os.getloadavg()[0]:.2f} at start")
        asyncio.run(receive(path, args.rate, args.seconds, args.burst))


if __name__ == "__main__":
    main()
