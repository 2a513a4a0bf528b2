"""A bid that prefers nodes holding its image (``Bid.prefer``, prefer_walk.py) against
the plain walk on the same book: at every bid of a random flow, the same GPUs fill at
each price (never a worse price, the same remainder and time in force), and at each price
the preferred nodes get at least as many; the book stays consistent."""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marketplace.engine import Ask, Bid, OrderBook

HOUR = 3600
TICK = 10_000
NODES = list(range(1000, 1007))

price_st = st.integers(-3, 3).map(lambda k: 2_490_000 + k * TICK)
bid_op = st.tuples(
    st.just("bid"),
    st.integers(1, 6),  # owner (few: self-trade prevention happens)
    price_st,
    st.sampled_from([1, 1, 2, 4, 8]),  # gang
    st.integers(1, 3),  # gangs
    st.sampled_from([HOUR, 2 * HOUR, 5 * HOUR]),
    st.sampled_from(["GTC", "GTC", "IOC", "FOK"]),
    st.sampled_from([0, 0, 12004]),  # min_cuda
    st.frozensets(st.sampled_from(NODES), max_size=4),  # prefer
)
ask_op = st.tuples(
    st.just("ask"),
    st.integers(1, 6),
    price_st,
    st.sampled_from([1, 2, 4, 8, 8]),
    st.sampled_from([HOUR, 3 * HOUR, 6 * HOUR]),
    st.sampled_from([0, 12004]),
    st.sampled_from(NODES),
)
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 120))
ops_st = st.lists(st.one_of(bid_op, ask_op, ask_op, ask_op, cancel_op), max_size=120)


def consistent(book: OrderBook) -> None:
    """The ask side's structure: sorted levels, totals equal to the live asks' GPUs, the
    id index naming exactly the live cells, each level bound at or above its asks (cells
    laid out as in marketplace/engine/walks.py)."""
    assert book._ask_px == sorted(book._ask_lv)
    live = {}
    for p, (q, tot, cap, _index) in book._ask_lv.items():  # a level record (walks.py)
        cells = [c for c in q if c[0]]  # cells: [gpus left (0: dead), owner, id, ...]
        assert cells, p
        assert tot == sum(c[0] for c in cells)
        assert cap >= max(c[0] for c in cells)
        live.update({c[2]: c for c in cells})
    assert {i for i, c in book._ix.items() if len(c) == 11} == set(live)  # ask cells
    assert Counter(a.owner for a in book.asks()) == Counter(book._ask_own)


def by_price(fills, prefer=frozenset()):
    total, preferred = Counter(), Counter()
    for f in fills:
        total[f.price] += f.gpus
        if f.node in prefer:
            preferred[f.price] += f.gpus
    return total, preferred


def run_flow(ops) -> None:
    book = OrderBook()
    now = 1_700_000_000
    for n, op in enumerate(ops, start=1):
        now += 300
        if op[0] == "bid":
            _, owner, price, gang, gangs, dur, tif, need, prefer = op
            plain = Bid(n, owner, price, gang * gangs, gang, dur, n, tif, need)
            other = copy.deepcopy(book)
            expected = other.submit_bid(copy.copy(plain), now)
            bid = copy.copy(plain)
            bid.prefer = prefer
            got = book.submit_bid(bid, now)
            assert (got.remaining, got.rested, got.killed) == \
                (expected.remaining, expected.rested, expected.killed), op
            total, preferred = by_price(got.fills, prefer)
            total_plain, preferred_plain = by_price(expected.fills, prefer)
            assert total == total_plain, op  # the same GPUs at each price: never worse
            for p in total:
                assert preferred[p] >= preferred_plain[p], op
            assert all(f.price <= price for f in got.fills)
            assert [(b.id, b.gpus) for b in book.bids()] == \
                [(b.id, b.gpus) for b in other.bids()]
        elif op[0] == "ask":
            _, owner, price, gpus, window, cuda, node = op
            book.submit_ask(Ask(n, owner, price, gpus, node, now + window, n, cuda), now)
        else:
            book.cancel(op[1])
        consistent(book)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_st)
def test_preferring_bids_fill_the_same_prices_and_favour_their_nodes(ops):
    run_flow(ops)


def test_preference_only_reorders_asks_at_the_same_price():
    """Asks: node 1 at 100 (oldest), node 2 at 100, node 3 at 90. A bid for 4 GPUs
    preferring node 2 takes node 3 first (the better price, though not preferred), then
    node 2 ahead of the older node 1 at 100; a bid preferring a node that only asks a worse
    price takes the better one."""
    now = 1_700_000_000
    book = OrderBook()
    for i, (node, price) in enumerate([(1, 100), (2, 100), (3, 90)], start=1):
        book.submit_ask(Ask(i, 10 + i, price, 2, node, now + HOUR, i), now)
    r = book.submit_bid(Bid(4, 20, 100, 4, 2, 60, 4, prefer=frozenset({2})), now)
    assert [(f.node, f.price) for f in r.fills] == [(3, 90), (2, 100)]
    assert [(a.id, a.gpus) for a in book.asks()] == [(1, 2)]
    book.submit_ask(Ask(5, 15, 120, 2, 5, now + HOUR, 5), now)
    r = book.submit_bid(Bid(6, 21, 120, 2, 2, 60, 6, prefer=frozenset({5})), now)
    assert [(f.node, f.price) for f in r.fills] == [(1, 100)]  # node 5 asks more
    consistent(book)


def test_a_preferring_bid_still_cancels_its_owners_resting_asks():
    now = 1_700_000_000
    book = OrderBook()
    book.submit_ask(Ask(1, 7, 100, 2, 1, now + HOUR, 1), now)  # the bidder's own ask
    book.submit_ask(Ask(2, 8, 100, 2, 2, now + HOUR, 2), now)
    r = book.submit_bid(Bid(3, 7, 100, 4, 2, 60, 3, "IOC", prefer=frozenset({1})), now)
    assert r.self_trade_cancels == [1]
    assert [(f.ask_id, f.gpus) for f in r.fills] == [(2, 2)] and r.remaining == 2
    consistent(book)
