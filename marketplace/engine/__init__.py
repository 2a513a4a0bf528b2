"""Auction cores of gpumarket: plain Python 3.11, stdlib only, no Django (DESIGN.md Layout).

* ``OrderBook`` — the continuous auction of one GPU class (price-time priority, gangs,
  GTC/IOC/FOK, self-trade prevention); see ``marketplace.engine.book``.
* ``clear`` and friends — sealed-bid auction clearing (second / uniform / first price);
  see ``marketplace.engine.sealed``.

Units everywhere: integer micro-USD per GPU-hour, whole seconds, epoch seconds.
"""

from .book import OrderBook
from .sealed import (
    RULES,
    Award,
    Clearing,
    SealedBid,
    clear,
    clear_first_price,
    clear_second_price,
    clear_uniform_price,
)
from .types import TIME_IN_FORCE, Ask, Bid, Fill, MatchResult

__all__ = [
    "RULES",
    "TIME_IN_FORCE",
    "Ask",
    "Award",
    "Bid",
    "Clearing",
    "Fill",
    "MatchResult",
    "OrderBook",
    "SealedBid",
    "clear",
    "clear_first_price",
    "clear_second_price",
    "clear_uniform_price",
]
