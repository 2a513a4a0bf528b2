"""Order and result records of the continuous auction (one order book per GPU class).

Units (DESIGN.md "Units"): every price is integer micro-USD per GPU-hour (1 USD =
1_000_000), durations are whole seconds, times are integer epoch seconds. Never float.

These are dataclasses with ``slots=True`` (``Fill`` frozen); the order book mutates
``Bid.gpus`` and ``Ask.gpus`` in place as they fill (they always mean "GPUs still
wanted / still available").
"""

from __future__ import annotations

from dataclasses import dataclass

TIME_IN_FORCE = ("GTC", "IOC", "FOK")
"""Valid ``Bid.tif`` values (DESIGN.md "Continuous auction")."""


@dataclass(slots=True)
class Bid:
    """A buy order in the continuous auction.

    Fields:
        id: order id; unique among all bids AND asks of one book.
        owner: party id (user id); self-trade prevention compares these.
        price: limit, micro-USD per GPU-hour, > 0.
        gpus: GPUs still wanted (remaining), > 0, a multiple of ``gang``.
        gang: GPUs per node for each gang (DESIGN.md: "GPUs per node (gang size)");
            every fill is a whole number of gangs on one node.
        duration_s: lease length in seconds, > 0.
        seq: arrival sequence (time priority); smaller = earlier.
        tif: time in force, ``"GTC"`` (rests), ``"IOC"`` (remainder dropped) or
            ``"FOK"`` (all or nothing).
        min_cuda: lowest node CUDA version it runs on, as major * 1000 + minor
            (12.4 → 12004); 0: none. It fills only against asks with ``cuda >= min_cuda``.
        nvlink: each gang must be NVLink-connected (every pair of its GPUs linked); the
            book asks its ``links`` how many such gangs a node can give.
        min_rel: lowest node reliability, per mille (0.95 → 950); 0: none. It fills only
            against asks with ``rel >= min_rel``.
        avoid_node: a node it never fills on (a failed lease's); 0: none.
        image_only: it gives no command (its image's own command runs), so it fills only
            against asks whose node runs container images (``Ask.runs_images``).
        node: fill only against asks of this node id (a bid for one node picked from
            the offers); 0: any node.
        prefer: node ids it prefers (those holding its image): among asks at the SAME
            price, theirs fill first; never a worse price for it (prefer_walk.py). Read
            only when the bid comes in; empty: plain price-time order.
    """

    id: int
    owner: int
    price: int
    gpus: int
    gang: int
    duration_s: int
    seq: int
    tif: str = "GTC"
    min_cuda: int = 0
    nvlink: bool = False
    min_rel: int = 0
    avoid_node: int = 0
    image_only: bool = False
    node: int = 0
    prefer: frozenset[int] = frozenset()


@dataclass(slots=True)
class Ask:
    """A sell order: one node's GPUs in the continuous auction (always GTC).

    Fields:
        id: order id; unique among all bids AND asks of one book.
        owner: party id (the provider's user id).
        price: limit, micro-USD per GPU-hour, > 0.
        gpus: GPUs currently available on that node under this ask, > 0 on submit.
        node: node id; every fill against this ask is a lease on this node.
        available_until: epoch seconds; a bid matches only if
            ``now + bid.duration_s <= available_until``.
        seq: arrival sequence (time priority); smaller = earlier.
        cuda: the node's CUDA version, major * 1000 + minor; 0: unknown (then it fills
            only bids with no ``min_cuda``).
        rel: the node's reliability, per mille; 1000 when it has no record yet.
        runs_images: the node's runner runs container images (Docker); False: only local
            processes (``--runtime process``), which need the bid's command, so it fills no
            ``image_only`` bid.
    """

    id: int
    owner: int
    price: int
    gpus: int
    node: int
    available_until: int
    seq: int
    cuda: int = 0
    rel: int = 1000
    runs_images: bool = True


@dataclass(frozen=True, slots=True)
class Fill:
    """One trade: ``gpus`` GPUs of node ``node`` for bid ``bid_id`` from ask ``ask_id``.

    ``gpus`` is a whole number of the bid's gangs; ``price`` (micro-USD per GPU-hour) is
    the RESTING order's price (DESIGN.md: "the trade is at the resting order's price").
    Each fill becomes one lease. The engine's fast path (``OrderBook.buy``/``sell``) gives
    the same fields as plain tuples, in this order.
    """

    bid_id: int
    ask_id: int
    node: int
    gpus: int
    price: int


@dataclass(slots=True)
class MatchResult:
    """What one submit (or re-match) did.

    Fields:
        fills: trades in matching order.
        rested: the incoming order's remainder now rests in the book.
        self_trade_cancels: ids of RESTING orders cancelled by self-trade prevention.
        remaining: GPUs of the incoming order left unfilled (0 when filled); for a
            rested order this is what rests.
        killed: an FOK bid that could not fill whole; nothing at all changed.
    """

    fills: list[Fill]
    rested: bool
    self_trade_cancels: list[int]
    remaining: int
    killed: bool = False
