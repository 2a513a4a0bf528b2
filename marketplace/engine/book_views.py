"""Read-only views of the order book (a mixin of ``marketplace.engine.book.OrderBook``):
best prices, aggregated depth, the resting orders as ``Bid``/``Ask`` objects, size and
membership. Cells laid out as in ``walks.py``; prices integer micro-USD per GPU-hour.
"""

from __future__ import annotations

from .types import Ask, Bid


class BookViews:
    """``best_bid``, ``best_ask``, ``depth``, ``bids``, ``asks``, ``len``, ``in``."""

    __slots__ = ()


    def best_bid(self) -> int | None:
        """Highest resting bid price (micro-USD per GPU-hour), or ``None``."""
        px = self._bid_px
        return px[-1] if px else None

    def best_ask(self) -> int | None:
        """Lowest resting ask price (micro-USD per GPU-hour), or ``None``."""
        px = self._ask_px
        return px[0] if px else None

    def depth(self, levels: int = 10) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Aggregated book: ``(bids high→low, asks low→high)``, each ``(price, GPUs)``.

        At most ``levels`` price levels per side; ``GPUs`` is the total resting at that
        price (what the live feed shows; DESIGN.md "Everyone watches ... depth").
        """
        bt = self._bid_lv
        at = self._ask_lv
        bids = [(p, bt[p][1]) for p in self._bid_px[::-1][:levels]] if levels > 0 else []
        asks = [(p, at[p][1]) for p in self._ask_px[:levels]] if levels > 0 else []
        return bids, asks

    def bids(self) -> list[Bid]:
        """Resting bids in priority order (price high→low, then seq): the ``Bid`` each
        was submitted as (made from its fields for one given to ``buy``)."""
        lvs = self._bid_lv
        out = []
        for p in reversed(self._bid_px):
            for c in lvs[p][0]:
                if c[0]:
                    b = c[14]
                    if b is None:
                        b = c[14] = Bid(c[2], c[1], c[4], c[0], c[5], c[6], c[3], c[13],
                                        c[7], c[12], c[8], c[9], c[10], c[11])
                    out.append(b)
        return out

    def asks(self) -> list[Ask]:
        """Resting asks in priority order (price low→high, then seq), as ``Ask``s (see
        ``bids``)."""
        lvs = self._ask_lv
        out = []
        for p in self._ask_px:
            for c in lvs[p][0]:
                if c[0]:
                    a = c[10]
                    if a is None:
                        a = c[10] = Ask(c[2], c[1], c[4], c[0], c[5], c[6], c[3], c[7],
                                        c[8], c[9])
                    out.append(a)
        return out

    def __len__(self) -> int:
        """Number of resting orders (bids + asks)."""
        return len(self._ix)

    def __contains__(self, order_id: object) -> bool:
        """Whether a bid or ask with this id rests in the book."""
        return order_id in self._ix
