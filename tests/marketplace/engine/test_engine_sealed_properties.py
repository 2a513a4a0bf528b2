"""Sealed clearing against a naive reference written straight from DESIGN.md's wording."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from marketplace.engine import (
    Award,
    SealedBid,
    clear_first_price,
    clear_second_price,
    clear_uniform_price,
)

SETTINGS = settings(max_examples=400, deadline=None)


@st.composite
def sealed_bids(draw, *, with_minimums=True):
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        gpus = draw(st.integers(1, 10))
        mn = draw(st.integers(1, gpus)) if with_minimums else 1
        out.append(
            SealedBid(
                id=draw(st.integers(1, 10_000)) * 100 + i,  # unique, not in seq order
                owner=draw(st.integers(1, 4)),
                price=draw(st.integers(1, 8)) * 250_000,
                gpus=gpus,
                min_gpus=mn,
                seq=draw(st.integers(1, 5)),  # ties on purpose
            )
        )
    return out


lots = st.integers(1, 16)
reserves = st.sampled_from([0, 500_000, 1_000_000, 1_250_000])


def ref_allocate(bids, lot, reserve):
    eligible = [b for b in bids if b.price >= reserve]
    ranked = sorted(eligible, key=lambda b: (-b.price, b.seq, b.id))
    left, alloc = lot, {}
    for b in ranked:
        give = min(b.gpus, left)
        if give >= b.min_gpus and give > 0:
            alloc[b.id] = give
            left -= give
    winners = [(b, alloc[b.id]) for b in ranked if b.id in alloc]
    unallocated_prices = [b.price for b in ranked if alloc.get(b.id, 0) < b.gpus]
    high = max(unallocated_prices, default=reserve)
    return winners, high


def check_common(awards, bids, lot, reserve):
    by_id = {b.id: b for b in bids}
    assert sum(a.gpus for a in awards) <= lot
    assert len({a.bid_id for a in awards}) == len(awards)
    for a in awards:
        b = by_id[a.bid_id]
        assert b.price >= reserve
        assert reserve <= a.price <= b.price  # nobody pays more than its own bid
        assert b.min_gpus <= a.gpus <= b.gpus


@SETTINGS
@given(sealed_bids(), lots, reserves)
def test_uniform_price_matches_reference(bids, lot, reserve):
    c = clear_uniform_price(bids, lot_gpus=lot, reserve=reserve)
    winners, high = ref_allocate(bids, lot, reserve)
    if not winners:
        assert c.awards == []
        assert c.clearing_price is None
        return
    low = min(b.price for b, _ in winners)
    pay = max(reserve, min(high, low))
    assert c.clearing_price == pay
    assert c.awards == [Award(b.id, g, pay) for b, g in winners]
    check_common(c.awards, bids, lot, reserve)


@SETTINGS
@given(sealed_bids(), lots, reserves)
def test_first_price_matches_reference(bids, lot, reserve):
    c = clear_first_price(bids, lot_gpus=lot, reserve=reserve)
    winners, _ = ref_allocate(bids, lot, reserve)
    assert c.clearing_price is None
    assert c.awards == [Award(b.id, g, b.price) for b, g in winners]
    check_common(c.awards, bids, lot, reserve)


@SETTINGS
@given(sealed_bids(with_minimums=False), lots, reserves)
def test_uniform_without_minimums_is_the_highest_losing_unit(bids, lot, reserve):
    """Classic statement: with min 1 everywhere, price = highest losing bid-unit (or reserve)."""
    c = clear_uniform_price(bids, lot_gpus=lot, reserve=reserve)
    units = sorted(
        (b.price for b in bids if b.price >= reserve for _ in range(b.gpus)), reverse=True
    )
    if not units:
        assert c.clearing_price is None
        return
    assert sum(a.gpus for a in c.awards) == min(lot, len(units))  # no one is skipped
    losing = units[lot] if len(units) > lot else reserve
    assert c.clearing_price == max(reserve, losing)


@SETTINGS
@given(sealed_bids(), lots, reserves)
def test_second_price_matches_reference(bids, lot, reserve):
    c = clear_second_price(bids, lot_gpus=lot, reserve=reserve)
    ranked = sorted((b for b in bids if b.price >= reserve), key=lambda b: (-b.price, b.seq, b.id))
    if not ranked:
        assert c.awards == []
        assert c.clearing_price is None
        return
    pay = max(reserve, ranked[1].price if len(ranked) > 1 else reserve)
    assert c.awards == [Award(ranked[0].id, lot, pay)]
    assert c.clearing_price == pay
    assert pay <= ranked[0].price


@st.composite
def many_sealed_bids(draw):
    """Enough bids (> 4 * (4 * lot + 16)) to take the partial-sort path of the clearing."""
    n = draw(st.integers(130, 260))
    big_minimums = draw(st.booleans())  # then most head bids are skipped: the walk goes deep
    out = []
    for i in range(n):
        gpus = draw(st.integers(1, 6))
        mn = gpus if big_minimums and draw(st.integers(0, 9)) else 1
        out.append(
            SealedBid(
                i, i % 7, draw(st.integers(1, 40)) * 50_000, gpus, mn, draw(st.integers(1, 30))
            )
        )
    return out


@settings(max_examples=150, deadline=None)
@given(many_sealed_bids(), st.integers(1, 4), reserves)
def test_large_books_match_reference(bids, lot, reserve):
    c = clear_uniform_price(bids, lot_gpus=lot, reserve=reserve)
    winners, high = ref_allocate(bids, lot, reserve)
    if not winners:
        assert c == clear_first_price(bids, lot_gpus=lot, reserve=reserve)
        assert c.awards == []
        return
    pay = max(reserve, min(high, min(b.price for b, _ in winners)))
    assert c.awards == [Award(b.id, g, pay) for b, g in winners]
    f = clear_first_price(bids, lot_gpus=lot, reserve=reserve)
    assert f.awards == [Award(b.id, g, b.price) for b, g in winners]
