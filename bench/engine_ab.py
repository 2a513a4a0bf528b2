"""A/B of two engine versions on bench/orderbook.py's flow: best CPU time
(time.thread_time_ns, which other processes' load does not inflate) of RUNS runs each,
interleaved. Each folder holds `marketplace/` and `bench/` of one commit:

  git archive <commit> marketplace bench | tar -x -C /tmp/nodes_bench_before   # and _after
  .venv/bin/python bench/engine_ab.py [EVENTS] [RUNS] [BEFORE_DIR] [AFTER_DIR]
"""

from __future__ import annotations

import importlib
import sys
import time


def load(folder: str):
    """bench/orderbook.py of `folder`, with that folder's engine."""
    for name in [m for m in sys.modules
                 if m in ("marketplace", "orderbook") or m.startswith("marketplace.")]:
        del sys.modules[name]
    sys.path[:0] = [folder, f"{folder}/bench"]
    try:
        return importlib.import_module("orderbook")
    finally:
        del sys.path[:2]


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    folders = {"before": sys.argv[3] if len(sys.argv) > 3 else "/tmp/nodes_bench_before",
               "after": sys.argv[4] if len(sys.argv) > 4 else "/tmp/nodes_bench_after"}
    books = {label: load(folder) for label, folder in folders.items()}
    flow = books["before"].make_flow(events, 1)
    best = dict.fromkeys(books, float("inf"))
    for _ in range(runs):
        for label, bench in books.items():
            ops = bench.ours_prepare(flow)
            start = time.thread_time_ns()
            bench.ours_run(ops)
            best[label] = min(best[label], time.thread_time_ns() - start)
    for label in books:
        print(f"{label}: {events / (best[label] / 1e9):,.0f} events/s "
              f"(best CPU time of {runs})")


if __name__ == "__main__":
    main()
