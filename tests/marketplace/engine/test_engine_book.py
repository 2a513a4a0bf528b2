"""Hand-computed examples of the continuous-auction rules (DESIGN.md "Continuous auction")."""

from __future__ import annotations

import copy

import pytest

from marketplace.engine import Ask, Bid, Fill, MatchResult, OrderBook
from marketplace.engine import walks as book_mod

NOW = 1_700_000_000
HOUR = 3600
FAR = NOW + 30 * 24 * HOUR
USD = 1_000_000


def ask(id, price, gpus, *, owner=100, node=None, until=FAR, seq=None):
    return Ask(
        id=id,
        owner=owner,
        price=price,
        gpus=gpus,
        node=node if node is not None else id,
        available_until=until,
        seq=seq if seq is not None else id,
    )


def bid(id, price, gpus, *, owner=200, gang=1, duration=HOUR, seq=None, tif="GTC"):
    return Bid(
        id=id,
        owner=owner,
        price=price,
        gpus=gpus,
        gang=gang,
        duration_s=duration,
        seq=seq if seq is not None else id,
        tif=tif,
    )


def snapshot(b: OrderBook):
    return (
        [(x.id, x.price, x.gpus) for x in b.bids()],
        [(x.id, x.price, x.gpus) for x in b.asks()],
        b.depth(100),
    )


# ---------------------------------------------------------------- resting, views


def test_empty_book():
    b = OrderBook()
    assert b.best_bid() is None
    assert b.best_ask() is None
    assert b.depth() == ([], [])
    assert b.bids() == []
    assert b.asks() == []
    assert len(b) == 0


def test_orders_rest_without_cross_and_depth_aggregates():
    b = OrderBook()
    r = b.submit_bid(bid(1, 2_480_000, 4), NOW)
    assert r == MatchResult(fills=[], rested=True, self_trade_cancels=[], remaining=4)
    b.submit_bid(bid(2, 2_480_000, 2), NOW)
    b.submit_bid(bid(3, 2_470_000, 8), NOW)
    b.submit_ask(ask(4, 2_500_000, 8), NOW)
    b.submit_ask(ask(5, 2_510_000, 1), NOW)
    assert b.best_bid() == 2_480_000
    assert b.best_ask() == 2_500_000
    assert b.depth() == (
        [(2_480_000, 6), (2_470_000, 8)],
        [(2_500_000, 8), (2_510_000, 1)],
    )
    assert b.depth(1) == ([(2_480_000, 6)], [(2_500_000, 8)])
    assert [x.id for x in b.bids()] == [1, 2, 3]
    assert [x.id for x in b.asks()] == [4, 5]
    assert len(b) == 5
    assert 4 in b
    assert 99 not in b


# ---------------------------------------------------------------- price-time priority


def test_bid_walks_asks_cheapest_first_then_earliest_and_pays_resting_price():
    b = OrderBook()
    b.submit_ask(ask(1, 2_600_000, 2), NOW)
    b.submit_ask(ask(2, 2_500_000, 2), NOW)  # best price
    b.submit_ask(ask(3, 2_500_000, 2), NOW)  # same price, later
    r = b.submit_bid(bid(10, 3 * USD, 5), NOW)
    assert r.fills == [
        Fill(bid_id=10, ask_id=2, node=2, gpus=2, price=2_500_000),
        Fill(bid_id=10, ask_id=3, node=3, gpus=2, price=2_500_000),
        Fill(bid_id=10, ask_id=1, node=1, gpus=1, price=2_600_000),
    ]
    assert r.remaining == 0
    assert not r.rested
    assert [(a.id, a.gpus) for a in b.asks()] == [(1, 1)]
    assert b.bids() == []


def test_bid_stops_at_its_limit_and_rests_the_remainder():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 2), NOW)
    b.submit_ask(ask(2, 2_700_000, 8), NOW)
    bb = bid(10, 2_600_000, 6)
    r = b.submit_bid(bb, NOW)
    assert r.fills == [Fill(10, 1, 1, 2, 2_500_000)]
    assert r.rested
    assert r.remaining == 4
    assert bb.gpus == 4  # Bid.gpus means "still wanted"
    assert b.best_bid() == 2_600_000
    assert b.depth() == ([(2_600_000, 4)], [(2_700_000, 8)])


def test_ask_walks_bids_highest_first_then_earliest_and_trades_at_bid_price():
    b = OrderBook()
    b.submit_bid(bid(1, 2_400_000, 2), NOW)
    b.submit_bid(bid(2, 2_600_000, 2), NOW)
    b.submit_bid(bid(3, 2_600_000, 4), NOW)
    b.submit_bid(bid(4, 2_000_000, 4), NOW)  # below the ask's limit
    r = b.submit_ask(ask(10, 2_300_000, 8, node=77), NOW)
    assert r.fills == [
        Fill(2, 10, 77, 2, 2_600_000),
        Fill(3, 10, 77, 4, 2_600_000),
        Fill(1, 10, 77, 2, 2_400_000),
    ]
    assert r.remaining == 0
    assert not r.rested
    assert [x.id for x in b.bids()] == [4]
    assert b.asks() == []


def test_ask_remainder_rests():
    b = OrderBook()
    b.submit_bid(bid(1, 2_600_000, 2), NOW)
    a = ask(10, 2_500_000, 8)
    r = b.submit_ask(a, NOW)
    assert r.fills == [Fill(1, 10, 10, 2, 2_600_000)]
    assert r.rested
    assert r.remaining == 6
    assert a.gpus == 6
    assert b.depth() == ([], [(2_500_000, 6)])


def test_out_of_order_seq_keeps_time_priority():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 1, seq=50), NOW)
    b.submit_ask(ask(2, 2_500_000, 1, seq=10), NOW)  # earlier by seq, submitted later
    b.submit_ask(ask(3, 2_500_000, 1, seq=30), NOW)
    assert [a.id for a in b.asks()] == [2, 3, 1]
    r = b.submit_bid(bid(9, 2_500_000, 1), NOW)
    assert r.fills[0].ask_id == 2


# ---------------------------------------------------------------- self-trade prevention


def test_self_trade_cancels_resting_ask_and_walk_continues():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 4, owner=7), NOW)  # same owner as the bid
    b.submit_ask(ask(2, 2_550_000, 4, owner=8), NOW)
    r = b.submit_bid(bid(10, 2_600_000, 4, owner=7), NOW)
    assert r.self_trade_cancels == [1]
    assert r.fills == [Fill(10, 2, 2, 4, 2_550_000)]
    assert 1 not in b
    assert b.asks() == []
    assert b.depth() == ([], [])
    assert b.cancel(1) is False


def test_self_trade_cancels_resting_bid_for_incoming_ask():
    b = OrderBook()
    b.submit_bid(bid(1, 2_600_000, 2, owner=5), NOW)
    b.submit_bid(bid(2, 2_600_000, 2, owner=6), NOW)
    r = b.submit_ask(ask(10, 2_500_000, 4, owner=5), NOW)
    assert r.self_trade_cancels == [1]
    assert r.fills == [Fill(2, 10, 10, 2, 2_600_000)]
    assert r.rested
    assert r.remaining == 2
    assert b.bids() == []


def test_self_trade_only_among_crossing_orders():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 4, owner=8), NOW)
    b.submit_ask(ask(2, 2_900_000, 4, owner=7), NOW)  # own ask, but above the limit
    r = b.submit_bid(bid(10, 2_600_000, 4, owner=7), NOW)
    assert r.self_trade_cancels == []
    assert [a.id for a in b.asks()] == [2]


# ---------------------------------------------------------------- gangs


def test_gang_partial_fills_take_whole_gangs_per_node():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 5, node=11), NOW)  # 2 gangs of 2, 1 GPU left over
    b.submit_ask(ask(2, 2_500_000, 8, node=12), NOW)
    r = b.submit_bid(bid(10, 2_500_000, 8, gang=2), NOW)
    assert r.fills == [Fill(10, 1, 11, 4, 2_500_000), Fill(10, 2, 12, 4, 2_500_000)]
    assert all(f.gpus % 2 == 0 for f in r.fills)
    assert [(a.id, a.gpus) for a in b.asks()] == [(1, 1), (2, 4)]


def test_ask_smaller_than_gang_is_skipped_and_stays():
    b = OrderBook()
    b.submit_ask(ask(1, 2_400_000, 2), NOW)  # cheapest, but fewer than one gang
    b.submit_ask(ask(2, 2_500_000, 8), NOW)
    r = b.submit_bid(bid(10, 3 * USD, 4, gang=4), NOW)
    assert r.fills == [Fill(10, 2, 2, 4, 2_500_000)]
    assert [(a.id, a.gpus) for a in b.asks()] == [(1, 2), (2, 4)]


def test_gang_partial_leaves_remainder_resting_in_gang_multiples():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 7), NOW)
    bb = bid(10, 2_500_000, 12, gang=4)
    r = b.submit_bid(bb, NOW)
    assert r.fills == [Fill(10, 1, 1, 4, 2_500_000)]
    assert r.remaining == 8
    assert r.rested
    assert bb.gpus % bb.gang == 0


def test_incoming_ask_skips_bids_whose_gang_is_larger_than_what_is_left():
    b = OrderBook()
    b.submit_bid(bid(1, 2_700_000, 8, gang=8), NOW)
    b.submit_bid(bid(2, 2_600_000, 4, gang=2), NOW)
    b.submit_bid(bid(3, 2_550_000, 2, gang=1), NOW)
    r = b.submit_ask(ask(10, 2_500_000, 5), NOW)
    # bid 1 needs a gang of 8 > 5: skipped; bid 2 takes 2 gangs of 2; 1 GPU left: bid 3
    assert r.fills == [Fill(2, 10, 10, 4, 2_600_000), Fill(3, 10, 10, 1, 2_550_000)]
    assert r.remaining == 0
    assert [(x.id, x.gpus) for x in b.bids()] == [(1, 8), (3, 1)]


def test_incoming_ask_partial_on_a_gang_bid_keeps_the_bid_and_goes_on():
    b = OrderBook()
    b.submit_bid(bid(1, 2_700_000, 8, gang=2), NOW)
    b.submit_bid(bid(2, 2_600_000, 1), NOW)
    r = b.submit_ask(ask(10, 2_500_000, 3), NOW)
    assert r.fills == [Fill(1, 10, 10, 2, 2_700_000), Fill(2, 10, 10, 1, 2_600_000)]
    assert [(x.id, x.gpus) for x in b.bids()] == [(1, 6)]


# ---------------------------------------------------------------- duration window


def test_bid_skips_ask_whose_window_is_too_short():
    b = OrderBook()
    b.submit_ask(ask(1, 2_400_000, 8, until=NOW + HOUR - 1), NOW)
    b.submit_ask(ask(2, 2_500_000, 8, until=NOW + HOUR), NOW)  # exactly fits
    r = b.submit_bid(bid(10, 3 * USD, 4, duration=HOUR), NOW)
    assert r.fills == [Fill(10, 2, 2, 4, 2_500_000)]
    assert [(a.id, a.gpus) for a in b.asks()] == [(1, 8), (2, 4)]


def test_ask_skips_bid_whose_lease_outlasts_its_window():
    b = OrderBook()
    b.submit_bid(bid(1, 2_700_000, 4, duration=10 * HOUR), NOW)
    b.submit_bid(bid(2, 2_600_000, 4, duration=HOUR), NOW)
    r = b.submit_ask(ask(10, 2_500_000, 8, until=NOW + 2 * HOUR), NOW)
    assert r.fills == [Fill(2, 10, 10, 4, 2_600_000)]
    assert [x.id for x in b.bids()] == [1]
    assert r.rested
    assert r.remaining == 4


# ---------------------------------------------------------------- time in force


def test_ioc_never_rests():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 2), NOW)
    r = b.submit_bid(bid(10, 2_600_000, 6, tif="IOC"), NOW)
    assert r.fills == [Fill(10, 1, 1, 2, 2_500_000)]
    assert not r.rested
    assert r.remaining == 4
    assert b.bids() == []
    r = b.submit_bid(bid(11, 2_600_000, 6, tif="IOC"), NOW)
    assert r == MatchResult(fills=[], rested=False, self_trade_cancels=[], remaining=6)
    assert b.bids() == []
    assert 11 not in b


def test_fok_kill_leaves_book_unchanged():
    b = OrderBook()
    b.submit_ask(ask(1, 2_400_000, 2, owner=7), NOW)  # would be self-trade-cancelled
    b.submit_ask(ask(2, 2_500_000, 2), NOW)
    b.submit_ask(ask(3, 2_550_000, 2, until=NOW + 60), NOW)  # window too short
    b.submit_bid(bid(4, 2_000_000, 1), NOW)
    before = snapshot(b)
    fok = bid(10, 3 * USD, 4, owner=7, tif="FOK")
    r = b.submit_bid(fok, NOW)
    assert r == MatchResult(fills=[], rested=False, self_trade_cancels=[], remaining=4, killed=True)
    assert snapshot(b) == before
    assert fok.gpus == 4


def test_fok_with_nothing_crossing_is_killed():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 8), NOW)
    r = b.submit_bid(bid(10, 2_000_000, 1, tif="FOK"), NOW)
    assert r.killed
    assert r.remaining == 1
    assert b.bids() == []


def test_fok_that_can_fill_whole_fills():
    b = OrderBook()
    b.submit_ask(ask(1, 2_400_000, 3, owner=7), NOW)
    b.submit_ask(ask(2, 2_500_000, 3), NOW)
    b.submit_ask(ask(3, 2_500_000, 2), NOW)
    r = b.submit_bid(bid(10, 3 * USD, 4, gang=2, owner=7, tif="FOK"), NOW)
    assert not r.killed
    assert r.self_trade_cancels == [1]
    assert r.fills == [Fill(10, 2, 2, 2, 2_500_000), Fill(10, 3, 3, 2, 2_500_000)]
    assert r.remaining == 0
    assert [(a.id, a.gpus) for a in b.asks()] == [(2, 1)]


# ---------------------------------------------------------------- cancel, lease end, expiry


def test_cancel_bid_and_ask():
    b = OrderBook()
    b.submit_bid(bid(1, 2_400_000, 2), NOW)
    b.submit_bid(bid(2, 2_400_000, 3), NOW)
    b.submit_ask(ask(3, 2_600_000, 2), NOW)
    assert b.cancel(2) is True
    assert b.depth() == ([(2_400_000, 2)], [(2_600_000, 2)])
    assert b.cancel(2) is False
    assert b.cancel(3) is True
    assert b.best_ask() is None
    assert b.cancel(12345) is False
    assert b.cancel(1) is True
    assert b.best_bid() is None
    assert len(b) == 0


def test_cancelled_order_never_fills():
    b = OrderBook()
    b.submit_ask(ask(1, 2_400_000, 2), NOW)
    b.submit_ask(ask(2, 2_400_000, 2), NOW)
    b.submit_ask(ask(3, 2_400_000, 2), NOW)
    b.cancel(2)  # in the middle of its level
    r = b.submit_bid(bid(10, 2_400_000, 4), NOW)
    assert [f.ask_id for f in r.fills] == [1, 3]


def test_add_gpus_to_ask_then_rematch():
    b = OrderBook()
    a = ask(1, 2_500_000, 8, node=5)
    b.submit_ask(a, NOW)
    b.submit_bid(bid(2, 2_500_000, 6), NOW)  # leases 6 of 8
    assert a.gpus == 2
    r = b.submit_bid(bid(3, 2_700_000, 4, gang=4), NOW)  # gang 4 > 2 left: rests
    assert r.rested
    assert b.add_gpus_to_ask(1, 6) is True  # the 6-GPU lease ended
    assert a.gpus == 8
    assert b.depth() == ([(2_700_000, 4)], [(2_500_000, 8)])  # no match yet
    r = b.rematch_ask(1, NOW)
    assert r.fills == [Fill(3, 1, 5, 4, 2_700_000)]  # at the resting bid's price
    assert r.rested
    assert r.remaining == 4
    assert b.bids() == []
    assert [(x.id, x.gpus) for x in b.asks()] == [(1, 4)]


def test_add_gpus_to_gone_ask_is_false_and_rematch_unknown_raises():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 2), NOW)
    b.submit_bid(bid(2, 2_500_000, 2), NOW)  # ask fully leased: removed at 0
    assert b.add_gpus_to_ask(1, 2) is False
    with pytest.raises(KeyError):
        b.rematch_ask(1, NOW)
    with pytest.raises(ValueError, match="gpus"):
        b.add_gpus_to_ask(1, 0)


def test_rematch_keeps_time_priority():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 1), NOW)
    b.submit_ask(ask(2, 2_500_000, 1), NOW)
    b.submit_ask(ask(3, 2_500_000, 1), NOW)
    b.add_gpus_to_ask(1, 1)
    r = b.rematch_ask(1, NOW)
    assert r.fills == []
    assert [(x.id, x.gpus) for x in b.asks()] == [(1, 2), (2, 1), (3, 1)]
    assert b.depth() == ([], [(2_500_000, 4)])


def test_self_trade_check_comes_before_the_gang_and_window_skips():
    b = OrderBook()
    b.submit_bid(bid(1, 2_600_000, 2, owner=9, gang=2), NOW)
    b.submit_bid(bid(2, 2_600_000, 1, owner=9, duration=99 * HOUR), NOW)
    # Neither bid could trade with this ask (gang 2 > 1 GPU; lease outlasts the window),
    # yet both are the ask's owner's own crossing bids: cancelled (engine brief order).
    r = b.submit_ask(ask(3, 2_500_000, 1, owner=9, until=NOW + HOUR), NOW)
    assert r.self_trade_cancels == [1, 2]
    assert r.fills == []
    assert b.bids() == []
    assert r.rested


def test_expire_removes_closed_asks():
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 2, until=NOW + 10), NOW)
    b.submit_ask(ask(2, 2_400_000, 2, until=NOW + 100), NOW)
    b.submit_bid(bid(3, 2_000_000, 2), NOW)
    assert b.expire(NOW + 9) == []
    assert b.expire(NOW + 10) == [1]
    assert [x.id for x in b.asks()] == [2]
    assert b.expire(NOW + 1000) == [2]
    assert b.asks() == []
    assert [x.id for x in b.bids()] == [3]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs",
    [
        {"price": 0},
        {"gpus": 0},
        {"gpus": 6, "gang": 4},  # gang must divide gpus
        {"gang": 0},
        {"duration": 0},
        {"tif": "DAY"},
    ],
)
def test_invalid_bid_raises_and_changes_nothing(kwargs):
    b = OrderBook()
    b.submit_ask(ask(1, 2_500_000, 8), NOW)
    before = snapshot(b)
    args = {"price": 2_500_000, "gpus": 4, **kwargs}
    with pytest.raises(ValueError, match="invalid bid"):
        b.submit_bid(bid(10, args.pop("price"), args.pop("gpus"), **args), NOW)
    assert snapshot(b) == before


def test_invalid_ask_and_duplicate_ids_raise():
    b = OrderBook()
    with pytest.raises(ValueError, match="invalid ask"):
        b.submit_ask(ask(1, 0, 8), NOW)
    with pytest.raises(ValueError, match="invalid ask"):
        b.submit_ask(ask(1, 1, 0), NOW)
    b.submit_ask(ask(1, 2_500_000, 8), NOW)
    with pytest.raises(ValueError, match="duplicate"):
        b.submit_ask(ask(1, 2_500_000, 8), NOW)
    with pytest.raises(ValueError, match="duplicate"):
        b.submit_bid(bid(1, 2_000_000, 1), NOW)
    assert [(x.id, x.gpus) for x in b.asks()] == [(1, 8)]


# ---------------------------------------------------------------- lazy deletion housekeeping


def test_many_cancels_behind_a_resting_head_are_compacted(monkeypatch):
    monkeypatch.setattr(book_mod, "_COMPACT_MIN", 8)
    b = OrderBook()
    b.submit_bid(bid(1, 2_000_000, 1), NOW)  # the head that never moves
    for i in range(2, 500):
        b.submit_bid(bid(i, 2_000_000, 1), NOW)
        assert b.cancel(i)
    assert [x.id for x in b.bids()] == [1]
    assert len(b._bid_lv[2_000_000][0]) < 30  # dead cells do not pile up
    assert b.depth() == ([(2_000_000, 1)], [])
    r = b.submit_ask(ask(900, 2_000_000, 2), NOW)
    assert r.fills == [Fill(1, 900, 900, 1, 2_000_000)]


# ---------------------------------------------------------------- rebuilding a saved book


def test_rest_bid_and_ask_load_without_matching_and_seq_sets_priority():
    b = OrderBook()
    # a saved book: bid 3 could not use ask 1 (gang 4 > 2 GPUs), so the book is crossed
    b.rest_ask(ask(1, 2_500_000, 2, seq=1))
    b.rest_bid(bid(3, 2_600_000, 4, gang=4, seq=3))
    b.rest_bid(bid(2, 2_600_000, 1, seq=2))  # loaded later but earlier by seq
    assert b.depth() == ([(2_600_000, 5)], [(2_500_000, 2)])
    assert [x.id for x in b.bids()] == [2, 3]
    r = b.submit_ask(ask(9, 2_400_000, 5), NOW)
    assert r.fills == [Fill(2, 9, 9, 1, 2_600_000), Fill(3, 9, 9, 4, 2_600_000)]
    assert b.bids() == []


def test_rest_rejects_invalid_and_duplicate_orders():
    b = OrderBook()
    b.rest_ask(ask(1, 2_500_000, 2))
    with pytest.raises(ValueError, match="duplicate"):
        b.rest_bid(bid(1, 2_000_000, 1))
    with pytest.raises(ValueError, match="duplicate"):
        b.rest_ask(ask(1, 2_500_000, 2))
    with pytest.raises(ValueError, match="invalid bid"):
        b.rest_bid(bid(2, 2_000_000, 3, gang=2))
    with pytest.raises(ValueError, match="invalid ask"):
        b.rest_ask(ask(3, 2_500_000, 0))
    assert [x.id for x in b.asks()] == [1]
    assert b.bids() == []


def test_rest_buy_and_sell_plain_ints_equal_rest_bid_and_ask():
    """A saved book loaded through ``rest_buy``/``rest_sell`` (no Bid/Ask per row) holds
    and matches the same as one loaded through ``rest_bid``/``rest_ask``; same checks."""
    bids = [Bid(3, 30, 2_600_000, 8, 4, 3600, 3, "GTC", 12004, False, 950, 7, True, 0),
            Bid(2, 20, 2_600_000, 1, 1, 7200, 2), Bid(5, 50, 2_550_000, 2, 2, 3600, 5)]
    asks = [Ask(1, 10, 2_500_000, 2, 9, NOW + 7200, 1, 12006, 990, False),
            Ask(4, 40, 2_700_000, 8, 8, NOW + 3600, 4)]
    a, b = OrderBook(), OrderBook()
    for x in bids:
        a.rest_bid(copy.copy(x))
        b.rest_buy(x.id, x.owner, x.price, x.gpus, x.gang, x.duration_s, x.seq, x.tif,
                   x.min_cuda, x.nvlink, x.min_rel, x.avoid_node, x.image_only, x.node)
    for x in asks:
        a.rest_ask(copy.copy(x))
        b.rest_sell(x.id, x.owner, x.price, x.gpus, x.node, x.available_until, x.seq,
                    x.cuda, x.rel, x.runs_images)
    assert a.bids() == b.bids() == sorted(bids, key=lambda x: (-x.price, x.seq))
    assert a.asks() == b.asks() == asks
    assert a.depth() == b.depth()
    for book in (a, b):
        r = book.submit_ask(ask(9, 2_400_000, 5), NOW)
        assert r.fills == [Fill(2, 9, 9, 1, 2_600_000), Fill(5, 9, 9, 2, 2_550_000)]
    with pytest.raises(ValueError, match="duplicate"):
        b.rest_sell(3, 1, 2_500_000, 2, 1, NOW + 3600, 9)
    with pytest.raises(ValueError, match="invalid bid"):
        b.rest_buy(11, 1, 2_000_000, 3, 2, 3600, 11)
    with pytest.raises(ValueError, match="invalid ask"):
        b.rest_sell(12, 1, 2_500_000, 0, 1, NOW + 3600, 12)
    assert len(b) == len(a)
