"""Order-book core benchmark: our OrderBook vs the PyPI books orderly-chaos, cython-orderbook.

Flow (seeded, identical for every engine): 200,000 events; 90 % limit orders, half bids
half asks, 10 % cancels of a random earlier order (which may already be filled or gone).
Prices are normal around the reference 2_490_000 micro-USD per GPU-hour on a 10_000 tick
(bids centred 2 ticks below, asks 2 ticks above, sigma 4 ticks), so about a third of the
orders cross. Sizes 1-8 GPUs. For our book: gang 1, 1-hour leases, asks open for 30 days,
every order a different owner (no self-trade), GTC — i.e. reduced to what the peers
support (plain price/quantity limit orders + cancels), so traded volume must agree.

Order objects (our Bid/Ask, cython-orderbook's Order) are built before the clock starts;
orderly-chaos takes plain ints. Throughput: best of --repeat untimed-per-event runs.
Latency: a separate run timing every event with time.perf_counter_ns.

Run:  .venv/bin/python bench/orderbook.py [--events 200000] [--repeat 3] [--seed 1]
Peers: .venv/bin/pip install orderly-chaos cython-orderbook  (the `bench` extra).
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketplace.engine import Ask, Bid, OrderBook

REF = 2_490_000
TICK = 10_000
NOW = 1_700_000_000
UNTIL = NOW + 30 * 86_400


def make_flow(n: int, seed: int) -> list[tuple]:
    """Events: ("B"|"A", id, price, qty) or ("C", id)."""
    rng = random.Random(seed)
    flow: list[tuple] = []
    next_id = 0
    for _ in range(n):
        r = rng.random()
        if r < 0.10 and next_id:
            flow.append(("C", rng.randrange(1, next_id + 1)))
            continue
        next_id += 1
        side = "B" if r < 0.55 else "A"
        centre = REF - 2 * TICK if side == "B" else REF + 2 * TICK
        price = max(TICK, round(rng.gauss(centre, 4 * TICK) / TICK) * TICK)
        flow.append((side, next_id, price, rng.randint(1, 8)))
    return flow


# ----------------------------------------------------------------------------- engines


def ours_prepare(flow):
    ops = []
    for ev in flow:
        if ev[0] == "B":
            _, i, p, q = ev
            ops.append((0, Bid(i, i, p, q, 1, 3600, i)))
        elif ev[0] == "A":
            _, i, p, q = ev
            ops.append((1, Ask(i, i, p, q, i, UNTIL, i)))
        else:
            ops.append((2, ev[1]))
    return ops


def ours_run(ops, latencies=None):
    book = OrderBook()
    sb, sa, cancel = book.submit_bid, book.submit_ask, book.cancel
    now = NOW
    volume = 0
    if latencies is None:
        t0 = time.perf_counter_ns()
        for kind, x in ops:
            if kind == 0:
                r = sb(x, now)
            elif kind == 1:
                r = sa(x, now)
            else:
                cancel(x)
                continue
            for f in r.fills:
                volume += f.gpus
        return time.perf_counter_ns() - t0, volume
    clock = time.perf_counter_ns
    for kind, x in ops:
        t = clock()
        if kind == 0:
            sb(x, now)
        elif kind == 1:
            sa(x, now)
        else:
            cancel(x)
        latencies.append(clock() - t)
    return 0, 0


def orderly_load():
    import orderly_chaos

    return orderly_chaos


def orderly_prepare(flow):
    return [
        (0, ev[1], ev[2], ev[3])
        if ev[0] == "B"
        else (1, ev[1], ev[2], ev[3])
        if ev[0] == "A"
        else (2, ev[1], 0, 0)
        for ev in flow
    ]


def orderly_run(ops, latencies=None):
    oc = orderly_load()
    book = oc.LimitOrderBook()
    buy, sell, cancel = book.limit_buy, book.limit_sell, book.cancel
    unknown = oc.UnknownOrderIdError
    volume = 0
    clock = time.perf_counter_ns
    t0 = clock()
    for kind, i, p, q in ops:
        t = clock() if latencies is not None else 0
        if kind == 0:
            volume += buy(i, q, p)
        elif kind == 1:
            volume += sell(i, q, p)
        else:
            try:  # noqa: SIM105 - contextlib.suppress costs more in this hot loop
                cancel(i)
            except unknown:
                pass
        if latencies is not None:
            latencies.append(clock() - t)
    return clock() - t0, volume


def cython_prepare(flow):
    from cython_orderbook import Order, OrderSide

    ops = []
    ids: dict[int, str] = {}
    for ev in flow:
        if ev[0] in "BA":
            o = Order(OrderSide.BID if ev[0] == "B" else OrderSide.ASK, ev[3], ev[2])
            ids[ev[1]] = o.order_id  # the library assigns its own string ids
            ops.append((0, o))
        else:
            ops.append((1, ids.get(ev[1], "")))
    return ops


def cython_run(ops, latencies=None):
    from cython_orderbook import OrderBook as CyBook

    book = CyBook()
    add, cancel = book.add_limit_order, book.cancel_order
    clock = time.perf_counter_ns
    t0 = clock()
    for kind, x in ops:
        t = clock() if latencies is not None else 0
        if kind == 0:
            add(x)
        else:
            cancel(x)
        if latencies is not None:
            latencies.append(clock() - t)
    elapsed = clock() - t0
    volume = sum(t.quantity_filled for t in book.trade_log)
    return elapsed, volume


ENGINES = {
    "gpumarket OrderBook": (ours_prepare, ours_run),
    "orderly-chaos": (orderly_prepare, orderly_run),
    "cython-orderbook": (cython_prepare, cython_run),
}


# ----------------------------------------------------------------------------- driver


def pct(sorted_ns: list[int], q: float) -> int:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))]


def measure(name, prepare, run, flow, repeat):
    best = None
    volume = 0
    for _ in range(repeat):
        ops = prepare(flow)
        gc.collect()
        gc.disable()
        try:
            elapsed, volume = run(ops)
        finally:
            gc.enable()
        best = elapsed if best is None else min(best, elapsed)
    lat: list[int] = []
    ops = prepare(flow)
    gc.collect()
    gc.disable()
    try:
        run(ops, lat)
    finally:
        gc.enable()
    lat.sort()
    rate = len(flow) / (best / 1e9)
    print(
        f"{name:22s} {rate:12,.0f} events/s   p50 {pct(lat, 0.50) / 1000:6.2f} us"
        f"   p99 {pct(lat, 0.99) / 1000:6.2f} us   traded {volume:,} GPUs"
    )
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    flow = make_flow(args.events, args.seed)
    n_cancel = sum(1 for ev in flow if ev[0] == "C")
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"{args.events:,} events, {n_cancel:,} cancels, seed {args.seed}, "
        f"best of {args.repeat}"
    )
    rates: dict[str, float] = {}
    for name, (prepare, run) in ENGINES.items():
        try:
            rates[name] = measure(name, prepare, run, flow, args.repeat)
        except ImportError as exc:
            print(f"{name:22s} SKIPPED: cannot import ({exc}); try .venv/bin/pip install {name}")
    ours = rates.get("gpumarket OrderBook")
    for name, rate in rates.items():
        if ours and name != "gpumarket OrderBook":
            print(f"ratio gpumarket / {name}: {ours / rate:.2f}x")


if __name__ == "__main__":
    main()
