"""OrderBook against a naive list-scanning reference model, over random order flows
(with CUDA needs on bids and CUDA versions on asks' nodes)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marketplace.engine import Ask, Bid, Fill, MatchResult, OrderBook
from marketplace.engine import walks as book_mod

HOUR = 3600
TICK = 10_000
REF = 2_490_000


@dataclass
class RefBook:
    """The rules of the engine brief written as plainly as possible: sort, scan, remove."""

    bids: list[Bid] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)

    def _drop(self, side: list, order) -> None:
        side[:] = [o for o in side if o is not order]

    def _match_bid(self, bid: Bid, now: int) -> tuple[list[Fill], list[int], int]:
        fills, stc, left = [], [], bid.gpus
        for a in sorted(self.asks, key=lambda a: (a.price, a.seq)):
            if left == 0 or a.price > bid.price:
                break
            if a.owner == bid.owner:
                self._drop(self.asks, a)
                stc.append(a.id)
                continue
            if (now + bid.duration_s > a.available_until or a.gpus < bid.gang
                    or a.cuda < bid.min_cuda):
                continue
            k = min(left // bid.gang, a.gpus // bid.gang)
            fills.append(Fill(bid.id, a.id, a.node, k * bid.gang, a.price))
            left -= k * bid.gang
            a.gpus -= k * bid.gang
            if a.gpus == 0:
                self._drop(self.asks, a)
        return fills, stc, left

    def submit_bid(self, bid: Bid, now: int) -> MatchResult:
        saved = copy.deepcopy((self.bids, self.asks))
        fills, stc, left = self._match_bid(bid, now)
        if bid.tif == "FOK" and left:
            self.bids, self.asks = saved
            return MatchResult([], False, [], bid.gpus, True)
        bid.gpus = left
        rested = bool(left) and bid.tif == "GTC"
        if rested:
            self.bids.append(bid)
        return MatchResult(fills, rested, stc, left)

    def _match_ask(self, ask: Ask, now: int) -> tuple[list[Fill], list[int], int]:
        fills, stc, left = [], [], ask.gpus
        for b in sorted(self.bids, key=lambda b: (-b.price, b.seq)):
            if left == 0 or b.price < ask.price:
                break
            if b.owner == ask.owner:
                self._drop(self.bids, b)
                stc.append(b.id)
                continue
            if (now + b.duration_s > ask.available_until or b.gang > left
                    or ask.cuda < b.min_cuda):
                continue
            k = min(b.gpus // b.gang, left // b.gang)
            fills.append(Fill(b.id, ask.id, ask.node, k * b.gang, b.price))
            left -= k * b.gang
            b.gpus -= k * b.gang
            if b.gpus == 0:
                self._drop(self.bids, b)
        return fills, stc, left

    def submit_ask(self, ask: Ask, now: int) -> MatchResult:
        fills, stc, left = self._match_ask(ask, now)
        ask.gpus = left
        if left:
            self.asks.append(ask)
        return MatchResult(fills, bool(left), stc, left)

    def cancel(self, order_id: int) -> bool:
        for side in (self.bids, self.asks):
            for o in side:
                if o.id == order_id:
                    self._drop(side, o)
                    return True
        return False

    def add_gpus_to_ask(self, ask_id: int, gpus: int) -> bool:
        for a in self.asks:
            if a.id == ask_id:
                a.gpus += gpus
                return True
        return False

    def rematch_ask(self, ask_id: int, now: int) -> MatchResult:
        (a,) = [a for a in self.asks if a.id == ask_id]
        self._drop(self.asks, a)
        return self.submit_ask(a, now)

    def expire(self, now: int) -> list[int]:
        gone = [a for a in self.sorted_asks() if a.available_until <= now]
        for a in gone:
            self._drop(self.asks, a)
        return [a.id for a in gone]

    def sorted_bids(self) -> list[Bid]:
        return sorted(self.bids, key=lambda b: (-b.price, b.seq))

    def sorted_asks(self) -> list[Ask]:
        return sorted(self.asks, key=lambda a: (a.price, a.seq))


def state(bids, asks):
    return (
        [(b.id, b.owner, b.price, b.gpus, b.gang, b.duration_s, b.seq) for b in bids],
        [(a.id, a.owner, a.price, a.gpus, a.node, a.available_until, a.seq) for a in asks],
    )


def ref_depth(ref: RefBook):
    def agg(orders):
        out: dict[int, int] = {}
        for o in orders:
            out[o.price] = out.get(o.price, 0) + o.gpus
        return list(out.items())

    return agg(ref.sorted_bids()), agg(ref.sorted_asks())


price_st = st.integers(-3, 3).map(lambda t: REF + t * TICK)
bid_op = st.tuples(
    st.just("bid"),
    st.integers(1, 3),  # owner
    price_st,
    st.sampled_from([1, 2, 4]),  # gang
    st.integers(1, 3),  # gangs
    st.sampled_from([HOUR, 2 * HOUR, 5 * HOUR]),
    st.sampled_from(["GTC", "GTC", "IOC", "FOK"]),
    st.sampled_from([0, 0, 12004]),  # min_cuda: none, or 12.4
)
ask_op = st.tuples(
    st.just("ask"),
    st.integers(1, 3),
    price_st,
    st.integers(1, 8),
    st.sampled_from([HOUR, 3 * HOUR, 6 * HOUR]),  # window from now
    st.sampled_from([0, 12002, 12004, 12006]),  # the node's CUDA: unknown, 12.2, 12.4, 12.6
)
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 40))
lease_end_op = st.tuples(st.just("lease_end"), st.integers(0, 40), st.integers(1, 4))
expire_op = st.tuples(st.just("expire"))
ops_st = st.lists(
    st.one_of(bid_op, bid_op, ask_op, ask_op, cancel_op, lease_end_op, expire_op),
    max_size=60,
)


def run_flow(ops) -> None:
    book, ref = OrderBook(), RefBook()
    now = 1_700_000_000
    limits: dict[int, int] = {}
    needs: dict[int, int] = {}  # bid id → min_cuda; ask id → its node's CUDA
    cudas: dict[int, int] = {}
    for n, op in enumerate(ops, start=1):
        now += 600
        kind = op[0]
        if kind == "bid":
            _, owner, price, gang, gangs, dur, tif, need = op
            b = Bid(n, owner, price, gang * gangs, gang, dur, n, tif, need)
            needs[n] = need
            limits[n] = price
            r, rr = book.submit_bid(copy.copy(b), now), ref.submit_bid(copy.copy(b), now)
            assert r == rr
            submitted = b.gpus
        elif kind == "ask":
            _, owner, price, gpus, window, cuda = op
            a = Ask(n, owner, price, gpus, 1000 + n, now + window, n, cuda)
            cudas[n] = cuda
            limits[n] = price
            r, rr = book.submit_ask(copy.copy(a), now), ref.submit_ask(copy.copy(a), now)
            assert r == rr
            submitted = a.gpus
        elif kind == "cancel":
            assert book.cancel(op[1]) == ref.cancel(op[1])
            r = None
        elif kind == "lease_end":
            _, ask_id, gpus = op
            ok = book.add_gpus_to_ask(ask_id, gpus)
            assert ok == ref.add_gpus_to_ask(ask_id, gpus)
            r = None
            if ok:
                r, rr = book.rematch_ask(ask_id, now), ref.rematch_ask(ask_id, now)
                assert r == rr
                submitted = None
        else:
            assert book.expire(now) == ref.expire(now)
            r = None
        if r is not None:
            filled = sum(f.gpus for f in r.fills)
            if submitted is not None:  # quantity is conserved
                assert filled + r.remaining == submitted
            if r.killed:
                assert r.fills == []
                assert r.self_trade_cancels == []
            for f in r.fills:  # never worse than either limit
                assert limits[f.ask_id] <= f.price <= limits[f.bid_id]
                assert cudas[f.ask_id] >= needs[f.bid_id]  # CUDA compatibility
                assert f.gpus > 0
        assert state(book.bids(), book.asks()) == state(ref.sorted_bids(), ref.sorted_asks())
        assert book.depth(100) == ref_depth(ref)
        bids, asks = book.depth(100)
        assert book.best_bid() == (bids[0][0] if bids else None)
        assert book.best_ask() == (asks[0][0] if asks else None)
        assert all(b.gpus % b.gang == 0 and b.gpus > 0 for b in book.bids())
        assert all(a.gpus > 0 for a in book.asks())


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(ops_st)
def test_book_matches_reference_model(ops):
    run_flow(ops)


@SETTINGS
@given(ops_st)
def test_book_matches_reference_model_with_eager_compaction(ops):
    saved = book_mod._COMPACT_MIN
    book_mod._COMPACT_MIN = 0  # compact on every dead cell: exercises that path too
    try:
        run_flow(ops)
    finally:
        book_mod._COMPACT_MIN = saved
