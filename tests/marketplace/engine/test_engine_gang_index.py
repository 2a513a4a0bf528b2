"""The ask levels' GPU-count index (``OrderBook._ask_ge``, ``_ask_lo``) against the plain
walk: on random gang flows a book that uses it gives the same results and the same book
as one whose gang bids walk every resting ask (``_ge_min_gang`` out of reach)."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marketplace.engine import Ask, Bid, OrderBook, gang_walks, walks
from marketplace.engine import book as book_module

HOUR = 3600
TICK = 10_000


class PlainBook(OrderBook):
    """The same book, every bid walking the levels' full deques (no index)."""

    __slots__ = ()
    _ge_min_gang = 1 << 30


price_st = st.integers(-3, 3).map(lambda k: 2_490_000 + k * TICK)
bid_op = st.tuples(
    st.just("bid"),
    st.integers(1, 6),  # owner (few: self-trade prevention happens)
    price_st,
    st.sampled_from([1, 2, 2, 3, 4, 4, 5, 6, 7, 8, 8, 9, 12]),  # gang (9, 12: above the top bucket)
    st.integers(1, 3),  # gangs
    st.sampled_from([HOUR, 2 * HOUR, 5 * HOUR]),
    st.sampled_from(["GTC", "GTC", "GTC", "IOC", "FOK"]),
    st.sampled_from([0, 0, 12004]),  # min_cuda
    st.sampled_from([0, 0, 0, 1003]),  # node (only)
)
ask_op = st.tuples(
    st.just("ask"),
    st.integers(1, 6),
    price_st,
    st.sampled_from([1, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 16]),
    st.sampled_from([HOUR, 3 * HOUR, 6 * HOUR]),
    st.sampled_from([0, 12004]),
    st.booleans(),  # rest straight (rest_ask) instead of submit
)
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 120))
lease_end_op = st.tuples(st.just("lease_end"), st.integers(0, 120), st.integers(1, 8))
ops_st = st.lists(
    st.one_of(bid_op, bid_op, ask_op, ask_op, ask_op, cancel_op, lease_end_op),
    max_size=150,
)


def _state(book: OrderBook):
    return ([(b.id, b.gpus) for b in book.bids()], [(a.id, a.gpus) for a in book.asks()],
            book.depth(100))


def run_flow(ops) -> None:
    books = (OrderBook(), PlainBook())
    now = 1_700_000_000
    for n, op in enumerate(ops, start=1):
        now += 300
        kind = op[0]
        if kind == "bid":
            _, owner, price, gang, gangs, dur, tif, need, only = op
            b = Bid(n, owner, price, gang * gangs, gang, dur, n, tif, need, node=only)
            got = [bk.submit_bid(copy.copy(b), now) for bk in books]
        elif kind == "ask":
            _, owner, price, gpus, window, cuda, straight = op
            a = Ask(n, owner, price, gpus, 1000 + n % 7, now + window, n, cuda)
            if straight:  # as a saved book is loaded: no matching, any seq order
                a.seq = n - 1000
                for bk in books:
                    bk.rest_ask(copy.copy(a))
                got = [None, None]
            else:
                got = [bk.submit_ask(copy.copy(a), now) for bk in books]
        elif kind == "cancel":
            got = [bk.cancel(op[1]) for bk in books]
        else:
            _, ask_id, gpus = op
            got = [bk.add_gpus_to_ask(ask_id, gpus) for bk in books]
            if got[0]:
                got = [bk.rematch_ask(ask_id, now) for bk in books]
        assert got[0] == got[1], op
        assert _state(books[0]) == _state(books[1]), op


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(ops_st)
def test_gang_index_equals_plain_walk(ops):
    run_flow(ops)


@SETTINGS
@given(ops_st)
def test_gang_index_equals_plain_walk_with_eager_rebuilds(ops):
    saved = gang_walks._GE_SLACK, walks._COMPACT_MIN
    # drop the indexes, compact all the time (book.py tests the slack on its hot path)
    gang_walks._GE_SLACK = book_module._GE_SLACK = walks._COMPACT_MIN = 0
    try:
        run_flow(ops)
    finally:
        gang_walks._GE_SLACK, walks._COMPACT_MIN = saved
        book_module._GE_SLACK = saved[0]


def test_a_gang_bid_skips_small_leftovers_and_keeps_price_time_order():
    """Leftovers of 1 GPU ahead of whole 8-GPU asks: the gang-4 bid fills the oldest ask
    that holds a gang at the best price, then the next; the leftovers stay."""
    book = OrderBook()
    now = 1_700_000_000
    for i in range(1, 6):
        book.submit_ask(Ask(i, i, 100, 1, i, now + HOUR, i), now)
    book.submit_ask(Ask(6, 6, 100, 8, 6, now + HOUR, 6), now)
    book.submit_ask(Ask(7, 7, 90, 3, 7, now + HOUR, 7), now)  # cheaper but no gang of 4
    r = book.submit_bid(Bid(8, 8, 100, 4, 4, 60, 8), now)
    assert [(f.ask_id, f.gpus) for f in r.fills] == [(6, 4)]
    r = book.submit_bid(Bid(9, 9, 100, 8, 4, 60, 9, "IOC"), now)
    assert [(f.ask_id, f.gpus) for f in r.fills] == [(6, 4)] and r.remaining == 4
    assert [(a.id, a.gpus) for a in book.asks()] == [(7, 3), (1, 1), (2, 1), (3, 1), (4, 1),
                                                    (5, 1)]
    book.add_gpus_to_ask(3, 3)  # a lease ends: ask 3 holds 4 again, ahead in time
    r = book.submit_bid(Bid(10, 10, 100, 4, 4, 60, 10), now)
    assert [(f.ask_id, f.gpus) for f in r.fills] == [(3, 4)]
