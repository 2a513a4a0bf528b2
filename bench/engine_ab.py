"""A/B of two engine versions on bench/orderbook.py's flows: best CPU time
(time.thread_time_ns, which other processes' load does not inflate) of RUNS runs each,
interleaved, orders built inside the timed region: through ``submit_bid``/``submit_ask``
(a Bid/Ask per order) and, where the engine has it, the plain-int ``buy``/``sell``.
Each folder holds `marketplace/` of one commit; the flows come from this checkout's
bench/orderbook.py:

  git archive <commit> marketplace | tar -x -C /tmp/engine_before   # and _after
  .venv/bin/python bench/engine_ab.py [EVENTS] [RUNS] [BEFORE_DIR] [AFTER_DIR] [SHAPES]
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orderbook


def load(folder: str):
    """`marketplace.engine` of `folder` (SystemExit if it has none: never this checkout's)."""
    if not (Path(folder) / "marketplace" / "engine" / "__init__.py").is_file():
        raise SystemExit(f"{folder}: no marketplace/engine (git archive it first)")
    for name in [m for m in sys.modules if m == "marketplace" or m.startswith("marketplace.")]:
        del sys.modules[name]
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("marketplace.engine")
    finally:
        del sys.path[0]


def run_ints(engine, flow) -> int:
    """CPU ns to run `flow` on a fresh book of `engine` through its plain-int fast path
    (``buy``/``sell``, as orderbook.ours_ints_run; fills read and cleared per event)."""
    book = engine.OrderBook()
    buy, sell, cancel = book.buy, book.sell, book.cancel
    now, until = orderbook.NOW, orderbook.UNTIL
    fills: list = []
    stc: list = []
    volume = 0
    t0 = time.thread_time_ns()
    for ev in flow:
        kind = ev[0]
        if kind == "B":
            _, i, p, q, g = ev
            buy(i, i, p, q, g, 3600, i, now, fills, stc)
        elif kind == "A":
            _, i, p, q, _g = ev
            sell(i, i, p, q, i, until, i, now, fills, stc)
        else:
            cancel(ev[1])
        if fills:
            for f in fills:
                volume += f[3]
            fills.clear()
    return time.thread_time_ns() - t0


def run(engine, flow) -> int:
    """CPU ns to run `flow` on a fresh book of `engine` through ``submit_bid``/
    ``submit_ask`` with a ``Bid``/``Ask`` per order (as orderbook.ours_run)."""
    book = engine.OrderBook()
    sb, sa, cancel = book.submit_bid, book.submit_ask, book.cancel
    bid, ask = engine.Bid, engine.Ask
    now, until = orderbook.NOW, orderbook.UNTIL
    t0 = time.thread_time_ns()
    for ev in flow:
        kind = ev[0]
        if kind == "B":
            _, i, p, q, g = ev
            sb(bid(i, i, p, q, g, 3600, i), now)
        elif kind == "A":
            _, i, p, q, _g = ev
            sa(ask(i, i, p, q, i, until, i), now)
        else:
            cancel(ev[1])
    return time.thread_time_ns() - t0


def main() -> None:
    argv = sys.argv[1:]
    events = int(argv[0]) if argv else 100_000
    runs = int(argv[1]) if len(argv) > 1 else 15
    folders = {"before": argv[2] if len(argv) > 2 else "/tmp/engine_before",
               "after": argv[3] if len(argv) > 3 else "/tmp/engine_after"}
    shapes = argv[4].split(",") if len(argv) > 4 else list(orderbook.SHAPES)
    engines = {label: load(folder) for label, folder in folders.items()}
    paths = {}  # (label, API) -> (engine, runner): the object API, and buy/sell if any
    for label, engine in engines.items():
        paths[label, "submit"] = engine, run
        if hasattr(engine.OrderBook, "buy"):
            paths[label, "buy/sell"] = engine, run_ints
    print(f"load average {os.getloadavg()[0]:.1f}")
    for shape in shapes:
        flow = orderbook.make_flow(events, 1, shape)
        best = dict.fromkeys(paths, float("inf"))
        for _ in range(runs):
            for key, (engine, runner) in paths.items():
                best[key] = min(best[key], runner(engine, flow))
        print(shape, "  ".join(f"{label} {api}: {events / (best[label, api] / 1e9):,.0f}"
                               for label, api in paths), f"events/s (best CPU time of {runs})")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
