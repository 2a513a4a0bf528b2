"""Sealed-bid auction clearing for one provider lot (a node's N GPUs for D hours).

Source of the rules: DESIGN.md "The two auctions" → "Sealed-bid auction" (authoritative
where any shorter statement differs).

* ``second_price`` — Vickrey (W. Vickrey, "Counterspeculation, Auctions, and Competitive
  Sealed Tenders", J. Finance 16(1), 1961): one lot of all N GPUs; the highest eligible
  bid wins all of it and pays ``max(second-highest eligible bid price, reserve)``.
* ``uniform_price`` — multi-unit: allocate as below; every winner pays
  ``max(reserve, min(H, L))`` per GPU-hour, where H is the highest price of any eligible
  bid-unit left unallocated (none: H = reserve) and L is the lowest winning price. Without
  minimums this is the classic highest-losing-bid uniform price; with them nobody ever
  pays more than its own bid.
* ``first_price`` — multi-unit, allocated as below, each winner pays its own bid
  (discriminatory / pay-as-bid).

Multi-unit allocation, exactly (DESIGN.md): rank eligible bids by price (high first),
then ``seq`` (time), then ``id``; walk the ranking giving each bid
``min(gpus, GPUs left)``; a bid whose ``min_gpus`` cannot be met gets nothing and the walk
goes on (a later, smaller bid may still win).

Eligibility: a bid with ``price < reserve`` never wins and is ignored entirely (it sets
no price either).

Units: prices and ``reserve`` are integer micro-USD per GPU-hour; ``gpus`` are counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

__all__ = [
    "RULES",
    "Award",
    "Clearing",
    "SealedBid",
    "clear",
    "clear_first_price",
    "clear_second_price",
    "clear_uniform_price",
]


@dataclass(frozen=True, slots=True)
class SealedBid:
    """One sealed bid.

    Fields:
        id: bid id (last tie-break).
        owner: party id (user id).
        price: micro-USD per GPU-hour, > 0.
        gpus: GPUs wanted, > 0 (for ``second_price`` the caller bids for the whole lot).
        min_gpus: fewest GPUs acceptable, ``1 <= min_gpus <= gpus``.
        seq: arrival sequence (time); smaller = earlier.

    Raises:
        ValueError: on construction, when the constraints above do not hold.
    """

    id: int
    owner: int
    price: int
    gpus: int
    min_gpus: int
    seq: int

    def __post_init__(self) -> None:
        if self.price <= 0 or self.gpus <= 0 or not 1 <= self.min_gpus <= self.gpus:
            raise ValueError(f"invalid sealed bid {self!r}")


@dataclass(frozen=True, slots=True)
class Award:
    """A winner: ``gpus`` GPUs of the lot to bid ``bid_id`` at ``price`` per GPU-hour."""

    bid_id: int
    gpus: int
    price: int


@dataclass(frozen=True, slots=True)
class Clearing:
    """Result of a clearing.

    Fields:
        awards: winners only, in allocation order.
        clearing_price: the uniform / second price (micro-USD per GPU-hour); ``None`` under
            ``first_price`` or when nobody wins.
    """

    awards: list[Award]
    clearing_price: int | None


_SEQ_ID = attrgetter("seq", "id")
_PRICE = attrgetter("price")


def _check(lot_gpus: int, reserve: int) -> None:
    if lot_gpus <= 0:
        raise ValueError(f"lot_gpus must be > 0, got {lot_gpus}")
    if reserve < 0:
        raise ValueError(f"reserve must be >= 0, got {reserve}")


def _sort(bids: list[SealedBid]) -> list[SealedBid]:
    """Rank in place by price desc, seq asc, id asc (two stable C-keyed sorts)."""
    bids.sort(key=_SEQ_ID)
    bids.sort(key=_PRICE, reverse=True)  # reverse=True keeps equal keys in order
    return bids


def _ranked(bids: Sequence[SealedBid], reserve: int, lot_gpus: int) -> Iterator[SealedBid]:
    """Eligible bids in ranking order, lazily.

    The walk usually ends within the first few bids (a lot is a node's GPUs), so only the
    bids priced at or above the ``k``-th highest price are sorted first; the rest are
    sorted only if the walk reaches them. Both parts together are exactly the full
    ranking: the head holds every bid with ``price >= T`` (ties at ``T`` included).
    """
    k = 4 * lot_gpus + 16
    if len(bids) <= 4 * k:
        yield from _sort([b for b in bids if b.price >= reserve])
        return
    top = heapq.nlargest(k, [b.price for b in bids])
    cut = top[-1] if top[-1] > reserve else reserve
    yield from _sort([b for b in bids if b.price >= cut])
    yield from _sort([b for b in bids if reserve <= b.price < cut])


def _allocate(ranked: Iterable[SealedBid], lot_gpus: int) -> tuple[list[SealedBid], list[int], int]:
    """DESIGN.md multi-unit walk.

    Returns (winners, their GPUs, H) where H is the highest price of an unallocated
    bid-unit, or -1 when every eligible unit was allocated.
    """
    winners: list[SealedBid] = []
    got: list[int] = []
    left = lot_gpus
    high = -1
    for b in ranked:
        if not left:
            if high < 0:
                high = b.price
            break
        give = b.gpus
        if give > left:
            give = left
        if give < b.min_gpus:
            if high < 0:
                high = b.price
            continue
        winners.append(b)
        got.append(give)
        left -= give
        if give < b.gpus and high < 0:
            high = b.price
    return winners, got, high


def clear_second_price(bids: Sequence[SealedBid], *, lot_gpus: int, reserve: int) -> Clearing:
    """Vickrey (1961) second-price clearing of one lot of ``lot_gpus`` GPUs.

    Every bid is for the whole lot (the caller guarantees ``gpus == lot_gpus``; ``gpus``
    and ``min_gpus`` are not consulted). Bids below ``reserve`` are ignored. The best bid
    (price desc, seq asc, id asc) wins all ``lot_gpus`` and pays
    ``max(second-highest eligible price, reserve)`` — equal to its own price on a tie.

    Returns:
        ``Clearing`` with one award, or no award and ``clearing_price=None``.

    Raises:
        ValueError: ``lot_gpus <= 0`` or ``reserve < 0``.
    """
    _check(lot_gpus, reserve)
    prices = [b.price for b in bids if b.price >= reserve]
    if not prices:
        return Clearing([], None)
    top = max(prices)
    # A tie at the top means the second-highest bid price is the top price itself.
    tied = prices.count(top) > 1
    second = top if tied else max((p for p in prices if p != top), default=reserve)
    pay = second if second > reserve else reserve
    winner = min((b for b in bids if b.price == top), key=_SEQ_ID)
    return Clearing([Award(winner.id, lot_gpus, pay)], pay)


def clear_uniform_price(bids: Sequence[SealedBid], *, lot_gpus: int, reserve: int) -> Clearing:
    """Multi-unit uniform-price clearing (DESIGN.md rule).

    Allocation by the DESIGN.md walk (see module docstring); every winner pays
    ``max(reserve, min(H, L))`` per GPU-hour, H = highest unallocated eligible bid-unit
    price (none: ``reserve``), L = lowest winning price. Hence nobody pays more than its
    own bid and, without minimums, the price is the highest losing bid (or the reserve).

    Returns:
        ``Clearing`` (awards in allocation order, ``clearing_price``; ``None`` if no
        winner).

    Raises:
        ValueError: ``lot_gpus <= 0`` or ``reserve < 0``.
    """
    _check(lot_gpus, reserve)
    winners, got, high = _allocate(_ranked(bids, reserve, lot_gpus), lot_gpus)
    if not winners:
        return Clearing([], None)
    if high < 0:
        high = reserve
    low = winners[-1].price
    pay = high if high < low else low
    if pay < reserve:
        pay = reserve
    return Clearing([Award(b.id, g, pay) for b, g in zip(winners, got, strict=True)], pay)


def clear_first_price(bids: Sequence[SealedBid], *, lot_gpus: int, reserve: int) -> Clearing:
    """Multi-unit first-price (pay-as-bid) clearing (DESIGN.md rule).

    Allocation by the DESIGN.md walk; each winner pays its own bid price.

    Returns:
        ``Clearing`` with ``clearing_price=None``.

    Raises:
        ValueError: ``lot_gpus <= 0`` or ``reserve < 0``.
    """
    _check(lot_gpus, reserve)
    winners, got, _ = _allocate(_ranked(bids, reserve, lot_gpus), lot_gpus)
    return Clearing([Award(b.id, g, b.price) for b, g in zip(winners, got, strict=True)], None)


RULES: dict[str, Callable[..., Clearing]] = {
    "second_price": clear_second_price,
    "uniform_price": clear_uniform_price,
    "first_price": clear_first_price,
}
"""Rule name (as stored on a sealed auction) → clearing function."""


def clear(rule: str, bids: Sequence[SealedBid], *, lot_gpus: int, reserve: int) -> Clearing:
    """Clear ``bids`` under ``rule`` (``"second_price" | "uniform_price" | "first_price"``).

    Raises:
        ValueError: unknown rule, ``lot_gpus <= 0`` or ``reserve < 0``.
    """
    fn = RULES.get(rule)
    if fn is None:
        raise ValueError(f"unknown auction rule {rule!r}; expected one of {sorted(RULES)}")
    return fn(bids, lot_gpus=lot_gpus, reserve=reserve)
