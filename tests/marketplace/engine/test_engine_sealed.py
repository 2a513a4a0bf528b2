"""Hand-computed sealed-bid clearings (DESIGN.md "Sealed-bid auction")."""

from __future__ import annotations

import pytest

from marketplace.engine import (
    Award,
    Clearing,
    SealedBid,
    clear,
    clear_first_price,
    clear_second_price,
    clear_uniform_price,
)

USD = 1_000_000


def sb(id, price, gpus=8, min_gpus=None, *, seq=None, owner=None):
    return SealedBid(
        id=id,
        owner=owner if owner is not None else id,
        price=price,
        gpus=gpus,
        min_gpus=min_gpus if min_gpus is not None else 1,
        seq=seq if seq is not None else id,
    )


# ---------------------------------------------------------------- second price (Vickrey)


def test_second_price_winner_pays_second_highest():
    bids = [sb(1, 2 * USD), sb(2, 3 * USD), sb(3, 2_500_000)]
    c = clear_second_price(bids, lot_gpus=8, reserve=USD)
    assert c == Clearing([Award(bid_id=2, gpus=8, price=2_500_000)], 2_500_000)


def test_second_price_reserve_binds_with_single_bid():
    c = clear_second_price([sb(1, 3 * USD)], lot_gpus=8, reserve=2 * USD)
    assert c == Clearing([Award(1, 8, 2 * USD)], 2 * USD)


def test_second_price_reserve_binds_over_a_lower_second_bid_and_ignores_below_reserve():
    # bid 2 is below the reserve: it is ignored entirely, so the winner pays the reserve
    c = clear_second_price([sb(1, 3 * USD), sb(2, USD)], lot_gpus=8, reserve=2 * USD)
    assert c.awards == [Award(1, 8, 2 * USD)]
    assert c.clearing_price == 2 * USD


def test_second_price_tie_earlier_bid_wins_and_pays_its_own_price():
    bids = [sb(1, 3 * USD, seq=20), sb(2, 3 * USD, seq=10), sb(3, USD)]
    c = clear_second_price(bids, lot_gpus=4, reserve=0)
    assert c == Clearing([Award(2, 4, 3 * USD)], 3 * USD)


def test_second_price_tie_same_seq_lower_id_wins():
    bids = [sb(7, 3 * USD, seq=5), sb(4, 3 * USD, seq=5)]
    assert clear_second_price(bids, lot_gpus=4, reserve=0).awards == [Award(4, 4, 3 * USD)]


def test_second_price_no_eligible_bid():
    assert clear_second_price([], lot_gpus=8, reserve=0) == Clearing([], None)
    c = clear_second_price([sb(1, USD)], lot_gpus=8, reserve=2 * USD)
    assert c == Clearing([], None)


def test_bid_exactly_at_reserve_is_eligible():
    c = clear_second_price([sb(1, 2 * USD)], lot_gpus=8, reserve=2 * USD)
    assert c.awards == [Award(1, 8, 2 * USD)]


# ---------------------------------------------------------------- uniform price


def test_uniform_price_is_the_highest_losing_bid():
    # lot 8: A gets 5, B gets 3 of its 5; B's 2 unallocated units at 2.00 are the highest
    # losing bid-units (C's 4 units at 1.00 are lower): everyone pays 2.00.
    bids = [sb(1, 3 * USD, 5), sb(2, 2 * USD, 5), sb(3, USD, 4)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    assert c == Clearing([Award(1, 5, 2 * USD), Award(2, 3, 2 * USD)], 2 * USD)


def test_uniform_price_highest_losing_bid_from_a_fully_losing_bid():
    bids = [sb(1, 3 * USD, 4), sb(2, 2_500_000, 4), sb(3, 2 * USD, 4), sb(4, USD, 4)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    assert c.awards == [Award(1, 4, 2 * USD), Award(2, 4, 2 * USD)]
    assert c.clearing_price == 2 * USD


def test_minimum_not_met_is_skipped_and_a_later_smaller_bid_wins():
    # lot 8: A takes 6; B wants 4 at least 4 but only 2 are left -> nothing, walk goes on;
    # C (2, min 1) takes the last 2. H = 2.50 (B's units), L = 2.00 (C) -> pay min = 2.00,
    # so nobody pays more than its own bid.
    bids = [sb(1, 3 * USD, 6, 6), sb(2, 2_500_000, 4, 4), sb(3, 2 * USD, 2, 1)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    assert c == Clearing([Award(1, 6, 2 * USD), Award(3, 2, 2 * USD)], 2 * USD)
    f = clear_first_price(bids, lot_gpus=8, reserve=0)
    assert f == Clearing([Award(1, 6, 3 * USD), Award(3, 2, 2 * USD)], None)


def test_uniform_price_h_below_l():
    # Ranking A 3.00 x6, C 2.80 x2, B 2.50 x4: A and C fill the lot; B's units are the
    # highest unallocated (H = 2.50) and lie below the lowest winner (L = 2.80).
    bids = [sb(1, 3 * USD, 6), sb(2, 2_500_000, 4, 4), sb(3, 2_800_000, 2, 2)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    assert c.awards == [Award(1, 6, 2_500_000), Award(3, 2, 2_500_000)]
    assert c.clearing_price == 2_500_000  # H = 2.50 < L = 2.80


def test_uniform_price_reserve_binds_when_supply_exceeds_demand():
    # 6 GPUs wanted of 8 -> no unallocated unit, H = reserve -> everyone pays the reserve
    bids = [sb(1, 3 * USD, 4), sb(2, 2 * USD, 2)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=1_500_000)
    assert c == Clearing([Award(1, 4, 1_500_000), Award(2, 2, 1_500_000)], 1_500_000)


def test_uniform_price_reserve_binds_over_a_low_losing_bid():
    # the losing bid is below the reserve: ignored entirely; H = reserve
    bids = [sb(1, 3 * USD, 8), sb(2, USD, 8)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=2 * USD)
    assert c == Clearing([Award(1, 8, 2 * USD)], 2 * USD)


def test_uniform_price_ties_rank_by_seq_then_id():
    bids = [sb(1, 2 * USD, 4, seq=3), sb(2, 2 * USD, 4, seq=1), sb(3, 2 * USD, 4, seq=1)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    assert [a.bid_id for a in c.awards] == [2, 3]
    assert c.clearing_price == 2 * USD


def test_uniform_and_first_price_no_winner():
    assert clear_uniform_price([], lot_gpus=8, reserve=0) == Clearing([], None)
    assert clear_first_price([sb(1, USD)], lot_gpus=8, reserve=2 * USD) == Clearing([], None)
    # every minimum exceeds the lot
    assert clear_uniform_price([sb(1, USD, 9, 9)], lot_gpus=8, reserve=0) == Clearing([], None)


def test_first_price_each_pays_own_bid():
    bids = [sb(1, 3 * USD, 5), sb(2, 2 * USD, 5), sb(3, USD, 4)]
    c = clear_first_price(bids, lot_gpus=8, reserve=0)
    assert c == Clearing([Award(1, 5, 3 * USD), Award(2, 3, 2 * USD)], None)


# ---------------------------------------------------------------- dispatcher, validation


def test_clear_dispatches_by_rule():
    bids = [sb(1, 3 * USD, 8), sb(2, 2 * USD, 8)]
    assert clear("second_price", bids, lot_gpus=8, reserve=0).clearing_price == 2 * USD
    assert clear("uniform_price", bids, lot_gpus=8, reserve=0).clearing_price == 2 * USD
    assert clear("first_price", bids, lot_gpus=8, reserve=0).awards == [Award(1, 8, 3 * USD)]
    with pytest.raises(ValueError, match="unknown auction rule"):
        clear("dutch", bids, lot_gpus=8, reserve=0)


@pytest.mark.parametrize("fn", [clear_second_price, clear_uniform_price, clear_first_price])
def test_bad_lot_or_reserve_raises(fn):
    with pytest.raises(ValueError, match="lot_gpus"):
        fn([], lot_gpus=0, reserve=0)
    with pytest.raises(ValueError, match="reserve"):
        fn([], lot_gpus=8, reserve=-1)


@pytest.mark.parametrize(
    ("price", "gpus", "min_gpus"), [(0, 1, 1), (1, 0, 0), (1, 2, 0), (1, 2, 3)]
)
def test_invalid_sealed_bid_raises(price, gpus, min_gpus):
    with pytest.raises(ValueError, match="invalid sealed bid"):
        SealedBid(id=1, owner=1, price=price, gpus=gpus, min_gpus=min_gpus, seq=1)


def test_walk_reaches_beyond_the_presorted_head():
    # 200 bids at 5.00 that each need 9 GPUs of an 8-GPU lot (all skipped), then the only
    # bids that fit are the cheapest: the clearing must walk past the partial-sort head.
    bids = [sb(i, 5 * USD, 9, 9) for i in range(1, 201)]
    bids += [sb(1000, 2 * USD, 5, 5), sb(1001, USD, 3, 1), sb(1002, USD, 4, 1)]
    c = clear_uniform_price(bids, lot_gpus=8, reserve=0)
    # H = 5.00 (skipped units) but L = 1.00 -> everyone pays 1.00; bid 1002 gets 0 left
    assert c == Clearing([Award(1000, 5, USD), Award(1001, 3, USD)], USD)
    assert clear_first_price(bids, lot_gpus=8, reserve=0).awards == [
        Award(1000, 5, 2 * USD),
        Award(1001, 3, USD),
    ]


def test_ties_at_the_head_cut_are_all_ranked_by_seq_then_id():
    # 300 equal prices: the head cut at the k-th price must keep every tie in the head
    bids = [sb(i, 2 * USD, 1, seq=300 - i) for i in range(300)]
    c = clear_uniform_price(bids, lot_gpus=3, reserve=0)
    assert [a.bid_id for a in c.awards] == [299, 298, 297]
