"""Properties of the book's cancel and level-skip structures (lazy dead cells, per-level
gang/GPU bounds, owner counts): cancel-then-match equals a fresh book that never had the
order, and gang-heavy flows with many owners equal the plain reference model."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marketplace.engine import Ask, Bid, OrderBook

from .test_engine_book_properties import REF, TICK, RefBook, state

NOW = 1_700_000_000
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

order_st = st.tuples(
    st.sampled_from(["bid", "ask"]),
    st.integers(1, 12),  # owner (many: the level skip is allowed only for absent owners)
    st.integers(-4, 4).map(lambda t: REF + t * TICK),
    st.integers(1, 8),  # bid: gang; ask: GPUs
    st.integers(1, 2),  # bid: gangs
    st.sampled_from([3600, 7200]),  # bid duration / ask window
)


gang_order_st = st.tuples(
    st.sampled_from(["bid", "ask"]),
    st.integers(1, 30),  # owners seldom meet: the skip is taken, yet STP still occurs
    st.integers(-1, 1).map(lambda t: REF + t * TICK),  # few levels: long queues
    st.integers(1, 8),
    st.integers(1, 2),
    st.sampled_from([3600, 7200]),
)


def make(n: int, o) -> Bid | Ask:
    side, owner, price, a, b, dur = o
    if side == "bid":
        return Bid(n, owner, price, a * b, a, dur, n)
    return Ask(n, owner, price, a, 1000 + n, NOW + dur, n)  # a 2-hour bid skips 1-hour asks


def submit(book, order):
    if isinstance(order, Bid):
        return book.submit_bid(copy.copy(order), NOW)
    return book.submit_ask(copy.copy(order), NOW)


@SETTINGS
@given(st.lists(order_st, min_size=1, max_size=40), st.data())
def test_cancel_then_match_equals_a_book_without_the_order(orders, data):
    """Resting orders, one cancelled, then the rest of the flow: same fills and same book
    as a book that never received the cancelled order."""
    cut = data.draw(st.integers(1, len(orders)))
    victim = data.draw(st.integers(1, cut))
    a, b = OrderBook(), OrderBook()
    for n, o in enumerate(orders[:cut], start=1):
        # only resting orders make the comparison exact: build the prefix without trades
        order = make(n, o)
        if isinstance(order, Bid):
            a.rest_bid(copy.copy(order))
            if n != victim:
                b.rest_bid(copy.copy(order))
        else:
            a.rest_ask(copy.copy(order))
            if n != victim:
                b.rest_ask(copy.copy(order))
    assert a.cancel(victim)
    assert not a.cancel(victim)
    assert victim not in a
    for n, o in enumerate(orders[cut:], start=cut + 1):
        order = make(n, o)
        assert submit(a, order) == submit(b, order)
        assert state(a.bids(), a.asks()) == state(b.bids(), b.asks())
        assert a.depth(100) == b.depth(100)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(gang_order_st, gang_order_st,
                          st.tuples(st.just("cancel"), st.integers(0, 60))), max_size=80))
def test_gang_heavy_flow_with_many_owners_matches_reference(ops):
    """Gangs 1-8 against asks of 1-8 GPUs (levels often hold no whole gang), 12 owners,
    cancels: the book equals the list-scanning reference after every event."""
    book, ref = OrderBook(), RefBook()
    for n, op in enumerate(ops, start=1):
        if op[0] == "cancel":
            assert book.cancel(op[1]) == ref.cancel(op[1])
        else:
            order = make(n, op)
            if isinstance(order, Bid):
                assert book.submit_bid(copy.copy(order), NOW) == ref.submit_bid(
                    copy.copy(order), NOW)
            else:
                assert book.submit_ask(copy.copy(order), NOW) == ref.submit_ask(
                    copy.copy(order), NOW)
        assert state(book.bids(), book.asks()) == state(ref.sorted_bids(), ref.sorted_asks())
        assert len(book) == len(ref.bids) + len(ref.asks)


def test_a_bid_for_one_node_fills_only_on_that_node_both_ways():
    """``Bid.node`` (main's) holds in both walks: incoming bid and incoming ask."""
    b = OrderBook()
    b.submit_ask(Ask(1, 100, REF, 4, 7, NOW + 7200, 1), NOW)
    b.submit_ask(Ask(2, 101, REF + TICK, 4, 8, NOW + 7200, 2), NOW)
    r = b.submit_bid(Bid(3, 1, REF + TICK, 2, 1, 3600, 3, node=8), NOW)
    assert [(f.ask_id, f.node, f.gpus) for f in r.fills] == [(2, 8, 2)]
    b = OrderBook()
    b.submit_bid(Bid(1, 1, REF, 2, 1, 3600, 1, node=7), NOW)
    r = b.submit_ask(Ask(2, 100, REF, 4, 9, NOW + 7200, 2), NOW)
    assert r.fills == [] and r.rested
    r = b.submit_ask(Ask(3, 101, REF, 4, 7, NOW + 7200, 3), NOW)
    assert [(f.bid_id, f.node, f.gpus) for f in r.fills] == [(1, 7, 2)]
