"""A/B of the order-book core against an earlier commit's, in one process: both engines
loaded, the flow of bench/orderbook.py run on each in turn, best CPU time
(time.thread_time_ns, gc off) of N interleaved runs — CPU time, so other processes' load
inflates it less than wall clock.

    git archive <commit> marketplace/engine | tar -x -C /tmp/ab
    .venv/bin/python bench/engine_ab.py /tmp/ab/marketplace/engine --runs 12
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import marketplace.engine as current
from bench import orderbook as ob


def load(folder: str):
    """The engine package in `folder` (an earlier commit's marketplace/engine)."""
    spec = importlib.util.spec_from_file_location(
        "engine_before", Path(folder) / "__init__.py", submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_before"] = module
    spec.loader.exec_module(module)
    return module


def run(engine, flow) -> tuple[int, int]:
    """(CPU ns, GPUs traded) of one pass of `flow` through a new book of `engine`."""
    ops = []
    for ev in flow:
        if ev[0] == "B":
            _, i, p, q = ev
            ops.append((0, engine.Bid(i, i, p, q, 1, 3600, i)))
        elif ev[0] == "A":
            _, i, p, q = ev
            ops.append((1, engine.Ask(i, i, p, q, i, ob.UNTIL, i)))
        else:
            ops.append((2, ev[1]))
    book = engine.OrderBook()
    bid, ask, cancel = book.submit_bid, book.submit_ask, book.cancel
    volume = 0
    gc.disable()
    t0 = time.thread_time_ns()
    for kind, x in ops:
        if kind == 2:
            cancel(x)
            continue
        for f in (bid(x, ob.NOW) if kind == 0 else ask(x, ob.NOW)).fills:
            volume += f.gpus
    spent = time.thread_time_ns() - t0
    gc.enable()
    return spent, volume


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="folder of the earlier marketplace/engine")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    flow = ob.make_flow(args.events, 1)
    engines = {"before": load(args.before), "after": current}
    best: dict[str, list[int]] = {name: [] for name in engines}
    volumes: dict[str, int] = {}
    for _ in range(args.runs):
        for name, engine in engines.items():
            spent, volumes[name] = run(engine, flow)
            best[name].append(spent)
    for name, times in best.items():
        print(f"{name:6s} {len(flow) / (min(times) / 1e9):>12,.0f} events/s "
              f"(best CPU time of {len(times)}), {volumes[name]:,} GPUs traded")


if __name__ == "__main__":
    main()
