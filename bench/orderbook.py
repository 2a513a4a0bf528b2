"""Order-book core benchmark: our OrderBook vs orderly-chaos (C++ core) and a plain
heap-and-deque book in pure Python, on several seeded flows, all in the same run.

Every flow is a list of plain-int events ("B"|"A", id, price, qty, gang) or ("C", id);
each contestant builds its own order objects INSIDE the timed region (what a caller
pays: our ``Bid``/``Ask`` for ``submit_bid``/``submit_ask``, the heap book's lists;
orderly-chaos and our ``buy``/``sell`` fast path take ints). Shapes
(``SHAPES``): ``base`` (the old flow: prices normal, sigma 4 ticks, 10 % cancels of any
earlier id), ``narrow`` (sigma 1 tick), ``wide`` (uniform over ~100 ticks), ``deep``
(40,000 resting orders first, then a flow that rarely crosses), ``cancels`` (35 % cancels,
each of an order resting at that moment), ``gangs`` (bids of gangs of 2-8, asks of one
8-GPU node). For our book: 1-hour leases, asks open 30 days, every order a different
owner, GTC; so with gang 1 all books must trade the same volume (checked). The peers know
no gangs: on ``gangs`` they trade plain quantities (less work than ours, volume differs).

Run:  .venv/bin/python bench/orderbook.py [--events 200000] [--repeat 3] [--seeds 1,2]
      [--shapes base,narrow,...]
Peer: .venv/bin/pip install orderly-chaos  (the `bench` extra).
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import platform
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketplace.engine import Ask, Bid, OrderBook

REF = 2_490_000
TICK = 10_000
NOW = 1_700_000_000
UNTIL = NOW + 30 * 86_400


# ----------------------------------------------------------------------------- flows


def _price(rng, side, shape):
    if shape == "wide":
        return REF + rng.randint(-50, 50) * TICK
    sigma = 1 if shape == "narrow" else 4
    off = 2 if shape != "deep" else 8
    centre = REF - off * TICK if side == "B" else REF + off * TICK
    return max(TICK, round(rng.gauss(centre, sigma * TICK) / TICK) * TICK)


def make_flow(n: int, seed: int, shape: str = "base") -> list[tuple]:
    """Events ("B"|"A", id, price, qty, gang) or ("C", id); `shape` in SHAPES.

    Resting orders (for ``cancels``) are known by running the flow on the heap book."""
    rng = random.Random(seed)
    flow: list[tuple] = []
    ref = HeapBook()
    next_id = 0
    if shape == "deep":
        for _ in range(40_000):
            next_id += 1
            side = "B" if rng.random() < 0.5 else "A"
            off = rng.randint(10, 60) * TICK
            p = REF - off if side == "B" else REF + off
            flow.append((side, next_id, p, rng.randint(1, 8), 1))
    cancel_p = 0.35 if shape == "cancels" else 0.10
    while len(flow) < n:
        r = rng.random()
        if r < cancel_p and next_id:
            if shape == "cancels":
                ref_run(ref, flow)
                for _ in range(64):  # a random id that rests now (most recent ids do)
                    oid = rng.randrange(max(1, next_id - 2000), next_id + 1)
                    if oid in ref.live:
                        flow.append(("C", oid))
                        break
                continue
            flow.append(("C", rng.randrange(1, next_id + 1)))
            continue
        next_id += 1
        side = "B" if rng.random() < 0.5 else "A"
        if shape == "gangs":
            if side == "B":
                g = rng.choice((2, 2, 4, 4, 8)) if rng.random() < 0.5 else rng.randint(2, 8)
                flow.append((side, next_id, _price(rng, side, shape), g * rng.randint(1, 2), g))
            else:
                flow.append((side, next_id, _price(rng, side, shape), 8, 1))
            continue
        flow.append((side, next_id, _price(rng, side, shape), rng.randint(1, 8), 1))
    return flow


def ref_run(ref, flow):
    """Feed the heap book the events it has not seen yet (generation only)."""
    for ev in flow[ref.seen:]:
        if ev[0] == "B":
            ref.buy(ev[1], ev[3], ev[2])
        elif ev[0] == "A":
            ref.sell(ev[1], ev[3], ev[2])
        else:
            ref.cancel(ev[1])
    ref.seen = len(flow)


SHAPES = ("base", "narrow", "wide", "deep", "cancels", "gangs")


# ----------------------------------------------------------------------------- heap book


class HeapBook:
    """A plain price-time book: a heap of prices per side, a deque of [id, qty] per price,
    lazy cancels (qty set to 0). No gangs, windows or owners: price/quantity only."""

    def __init__(self):
        self.bid_px: list[int] = []  # negated prices
        self.ask_px: list[int] = []
        self.bid_q: dict[int, deque] = {}
        self.ask_q: dict[int, deque] = {}
        self.live: dict[int, list] = {}
        self.seen = 0

    def _match(self, oid, qty, limit, heap, levels, sign):
        while qty and heap:
            p = heap[0] * sign
            if (p > limit) if sign == 1 else (p < limit):
                break
            q = levels[p]
            while q and qty:
                o = q[0]
                if not o[1]:
                    q.popleft()
                    continue
                t = o[1] if o[1] < qty else qty
                o[1] -= t
                qty -= t
                self.traded += t
                if not o[1]:
                    q.popleft()
                    del self.live[o[0]]
            if not q:
                heapq.heappop(heap)
                del levels[p]
        return qty

    def _rest(self, oid, qty, price, heap, levels, key):
        o = [oid, qty]
        q = levels.get(price)
        if q is None:
            levels[price] = q = deque()
            heapq.heappush(heap, key)
        q.append(o)
        self.live[oid] = o

    traded = 0

    def buy(self, oid, qty, price):
        left = self._match(oid, qty, price, self.ask_px, self.ask_q, 1)
        if left:
            self._rest(oid, left, price, self.bid_px, self.bid_q, -price)

    def sell(self, oid, qty, price):
        left = self._match(oid, qty, price, self.bid_px, self.bid_q, -1)
        if left:
            self._rest(oid, left, price, self.ask_px, self.ask_q, price)

    def cancel(self, oid):
        o = self.live.pop(oid, None)
        if o is not None:
            o[1] = 0


# ----------------------------------------------------------------------------- contestants


def ours_ints_run(flow, latencies=None):
    """Our fast path: ``OrderBook.buy``/``sell`` take plain ints (like orderly-chaos) and
    append fill tuples to a list, which this caller reads (traded GPUs) and clears."""
    book = OrderBook()
    buy, sell, cancel = book.buy, book.sell, book.cancel
    now, until = NOW, UNTIL
    fills: list = []
    stc: list = []
    volume = 0
    clock = time.perf_counter_ns
    t0 = time.thread_time_ns()
    for ev in flow:
        t = clock() if latencies is not None else 0
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
        if latencies is not None:
            latencies.append(clock() - t)
    return time.thread_time_ns() - t0, volume


def ours_run(flow, latencies=None):
    """Our object API: a ``Bid``/``Ask`` per order, a ``MatchResult`` of ``Fill``s back."""
    book = OrderBook()
    sb, sa, cancel = book.submit_bid, book.submit_ask, book.cancel
    now = NOW
    volume = 0
    clock = time.perf_counter_ns
    t0 = time.thread_time_ns()
    for ev in flow:
        t = clock() if latencies is not None else 0
        kind = ev[0]
        if kind == "B":
            _, i, p, q, g = ev
            r = sb(Bid(i, i, p, q, g, 3600, i), now)
        elif kind == "A":
            _, i, p, q, _g = ev
            r = sa(Ask(i, i, p, q, i, UNTIL, i), now)
        else:
            cancel(ev[1])
            if latencies is not None:
                latencies.append(clock() - t)
            continue
        for f in r.fills:
            volume += f.gpus
        if latencies is not None:
            latencies.append(clock() - t)
    return time.thread_time_ns() - t0, volume


def orderly_run(flow, latencies=None):
    import orderly_chaos as oc

    book = oc.LimitOrderBook()
    buy, sell, cancel = book.limit_buy, book.limit_sell, book.cancel
    unknown = oc.UnknownOrderIdError
    volume = 0
    clock = time.perf_counter_ns
    t0 = time.thread_time_ns()
    for ev in flow:
        t = clock() if latencies is not None else 0
        kind = ev[0]
        if kind == "B":
            volume += buy(ev[1], ev[3], ev[2])
        elif kind == "A":
            volume += sell(ev[1], ev[3], ev[2])
        else:
            try:  # noqa: SIM105 - contextlib.suppress costs more in this hot loop
                cancel(ev[1])
            except unknown:
                pass
        if latencies is not None:
            latencies.append(clock() - t)
    return time.thread_time_ns() - t0, volume


def heap_run(flow, latencies=None):
    book = HeapBook()
    buy, sell, cancel = book.buy, book.sell, book.cancel
    clock = time.perf_counter_ns
    t0 = time.thread_time_ns()
    for ev in flow:
        t = clock() if latencies is not None else 0
        kind = ev[0]
        if kind == "B":
            buy(ev[1], ev[3], ev[2])
        elif kind == "A":
            sell(ev[1], ev[3], ev[2])
        else:
            cancel(ev[1])
        if latencies is not None:
            latencies.append(clock() - t)
    return time.thread_time_ns() - t0, book.traded


ENGINES = {
    "gpumarket buy/sell": ours_ints_run,
    "gpumarket submit": ours_run,
    "orderly-chaos": orderly_run,
    "heap-and-deque book": heap_run,
}


# ----------------------------------------------------------------------------- driver


def pct(sorted_ns: list[int], q: float) -> int:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))]


def _timed(run, flow, latencies=None):
    gc.collect()
    gc.disable()
    try:
        return run(flow, latencies)
    finally:
        gc.enable()


def measure(runs: dict, flow, repeat) -> dict:
    """{name: (events/s best of `repeat` by CPU time, p50 ns, p99 ns, traded GPUs)}.

    The contestants run in turn, `repeat` rounds (so a change of the shared machine's
    load hits them alike); throughput is CPU time (``time.thread_time_ns``), p50/p99 come
    from one more run each timing every event (perf_counter_ns). A contestant whose
    package is missing is left out with a note."""
    best: dict = {}
    volume: dict = {}
    for _ in range(repeat):
        for name, run in list(runs.items()):
            try:
                elapsed, volume[name] = _timed(run, flow)
            except ImportError as exc:
                print(f"{name}: SKIPPED ({exc}); pip install orderly-chaos")
                del runs[name]
                continue
            best[name] = min(best.get(name, elapsed), elapsed)
    out = {}
    for name, run in runs.items():
        lat: list[int] = []
        _timed(run, flow, lat)
        lat.sort()
        out[name] = (len(flow) / (best[name] / 1e9), pct(lat, 0.50), pct(lat, 0.99),
                     volume[name])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    print(f"python {platform.python_version()} ({platform.python_implementation()}), "
          f"{args.events:,} events per flow, best CPU time of {args.repeat} interleaved "
          f"rounds, load average {os.getloadavg()[0]:.1f}")
    print(f"{'flow':14s} {'engine':20s} {'events/s':>12s} {'p50 us':>7s} {'p99 us':>7s} "
          f"{'traded':>9s}  vs orderly / heap")
    for shape in args.shapes.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            flow = make_flow(args.events, seed, shape)
            res = measure(dict(ENGINES), flow, args.repeat)
            for name, (rate, p50, p99, vol) in res.items():
                extra = ""
                if name.startswith("gpumarket"):
                    oc = res.get("orderly-chaos", (0,))[0]
                    hb = res["heap-and-deque book"][0]
                    extra = f"  {rate / oc:.2f}x / {rate / hb:.2f}x" if oc else ""
                print(f"{shape + ' s' + str(seed):14s} {name:20s} {rate:12,.0f} "
                      f"{p50 / 1000:7.2f} {p99 / 1000:7.2f} {vol:9,d}{extra}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
