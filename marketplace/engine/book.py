"""The continuous auction: one GPU class's limit order book, price-time priority.

Rules (DESIGN.md "The two auctions" → "Continuous auction", with the precisions of the
engine brief):

* An incoming bid walks the asks by (price ascending, seq ascending) while
  ``ask.price <= bid.price``; an incoming ask walks the bids by (price descending, seq
  ascending) while ``bid.price >= ask.price``.
* Self-trade prevention: when the walk meets a RESTING order of the same ``owner``, that
  resting order is cancelled (removed; its id is reported in
  ``MatchResult.self_trade_cancels``) and the walk goes on ("cancel resting").
* A resting order the incoming one cannot use is skipped and stays in the book: the
  lease must fit the ask's window (``now + bid.duration_s <= ask.available_until``),
  the ask must still hold at least one whole gang (``ask.gpus >= bid.gang``) and its
  node must meet the bid's CUDA requirement (``ask.cuda >= bid.min_cuda``) and its
  reliability floor (``ask.rel >= bid.min_rel``), not be the bid's ``avoid_node``, be the
  bid's ``node`` when it names one, and run the bid's workload (an ``image_only`` bid needs
  an ask whose node ``runs_images``).
* Otherwise ``k = min(bid gangs left, ask.gpus // bid.gang)`` gangs trade at the RESTING
  order's price; a fill is always ``k * gang`` GPUs on the ask's one node.
* Time in force (bids only; asks are always GTC): GTC remainder rests, IOC remainder is
  dropped, FOK either fills whole or changes nothing at all (``killed=True``).

Because resting orders may be skipped (window, gang size), the book can be *crossed*
(best bid >= best ask) without a trade being possible; that is expected.

Units: prices are integer micro-USD per GPU-hour, GPUs are counts, times are integer
epoch seconds, durations whole seconds (DESIGN.md "Units").

Implementation: per side, a sorted list of the prices that have resting GPUs, and per
price one level record (a plain list: the deque of "cells", plain lists of the order's
fields, in seq order; the total GPUs at that price; the level's bounds and gang index;
layouts in walks.py), so a rest or a level walked costs one dict look-up.
``buy``/``sell`` take plain ints (the fast path); ``submit_bid``/``submit_ask`` wrap them
for ``Bid``/``Ask`` objects. Cancels are lazy (the cell's GPUs set to 0) and dead cells are
dropped when they reach the head of a level, when the level empties, or by an amortised
compaction. Each ask level keeps an upper bound of its asks' GPUs, each bid level a
lower bound of its bids' gangs (widened on rest, made exact by every walk of the whole
level), and each side counts resting orders per owner: a walk skips a level in O(1) when
no order there can trade (no whole gang) and none is the incoming order's owner's (so
self-trade prevention still cancels it). Gang walks skip what cannot serve them: a bid
of gang g (>= 2) starts at ``_ask_lo[v]`` (v = min(g, 8): no ask below that price holds
v GPUs) and walks each level through its index of the asks that held >= v GPUs (in seq
order, so price-time priority among the asks that can serve it is kept); an ask with
fewer than 8 GPUs left walks each bid level through its index of the bids of gang <= its
GPUs. The indexes are built on first use, appended on rest, and lazy (dead or too-small
entries dropped when met); a rest out of seq order or GPUs given back drops a level's
index, and a side's indexes are rebuilt once their appends pass 4096 + 16 x its live
orders. An incoming order whose owner rests orders on the other side walks the plain
deques (self-trade prevention). Bids and asks passed in are mutated: their ``gpus``
always mean "still wanted / still available".

Modules: this one submits (``buy``/``sell`` and their object wrappers); the walks are in
``walks.py``, ``gang_walks.py``, ``prefer_walk.py``; loading, cancels, lease ends and
expiry in ``book_upkeep.py``; the read-only views in ``book_views.py``.
"""


from __future__ import annotations

from bisect import insort
from collections import deque

from .book_upkeep import BookUpkeep
from .book_views import BookViews
from .gang_walks import _GE_SLACK, GangWalks, _ge_gc, _lower_lo
from .prefer_walk import PreferWalks
from .types import TIME_IN_FORCE, Ask, Bid, Fill, MatchResult
from .walks import _BIG, _GE_TOP, Walks, _insert

_NO_NODES: frozenset[int] = frozenset()

__all__ = ["OrderBook"]


class OrderBook(Walks, GangWalks, PreferWalks, BookUpkeep, BookViews):
    """One GPU class's continuous auction: price-time priority.

    Order ids must be unique across bids and asks of one book (``cancel`` takes either);
    a duplicate id, a non-positive price/gpus/gang/duration, ``gpus`` not a multiple of
    ``gang`` or an unknown ``tif`` raises ``ValueError`` and changes nothing.
    """

    #: bids of at least this gang walk ask levels through their GPU-count index (the
    #: property tests set it out of reach to compare with the plain walk)
    _ge_min_gang = 2

    __slots__ = (
        "_ask_dead",
        "_ask_gen",
        "_ask_lo",
        "_ask_lv",
        "_ask_own",
        "_ask_px",
        "_bid_dead",
        "_bid_gen",
        "_bid_lv",
        "_bid_own",
        "_bid_px",
        "_gmin",
        "_ix",
        "links",
    )

    def __init__(self) -> None:
        # Bids: prices ascending (best = last); asks: prices ascending (best = first).
        # Per price one level record (walks.py): bid [deque, total GPUs, gang lower bound,
        # gang index or None, gang upper bound]; ask [deque, total GPUs, GPU upper bound,
        # gang index or None]. The bounds are exact after a walk of the whole level. A bid
        # level's index, built on an ask's first walk there with < 8 GPUs left: {v: deque
        # of the cells whose bid's gang <= v}; an ask level's, built on a gang bid's first
        # walk there: {v: deque of the cells whose ask held >= v GPUs when indexed}; both in
        # seq order, entries die lazily.
        #: every resting order's cell by id, bids and asks alike (ids are unique across
        #: both sides; a bid cell has 15 fields, an ask cell 11: walks.py)
        self._ix: dict[int, list] = {}
        self._gmin = self._ge_min_gang  # read once: a slot costs less than a class attribute
        self._bid_px: list[int] = []
        self._bid_lv: dict[int, list] = {}
        self._bid_dead = 0
        self._bid_own: dict[int, int] = {}  # owner -> resting bids
        self._bid_gen = 0  # index entries appended since the last rebuild
        self._ask_px: list[int] = []
        self._ask_lv: dict[int, list] = {}
        self._ask_dead = 0
        self._ask_own: dict[int, int] = {}  # owner -> resting asks
        self._ask_gen = 0  # index entries appended since the last rebuild
        #: [v]: a price below which no resting ask holds >= v GPUs (v in 2..8; lowered
        #: by every rest, raised by the gang walks that find it so); gang walks start there
        self._ask_lo: list[int] = [_BIG] * (_GE_TOP + 1)
        #: links(node, gang, taken) → how many NVLink-connected gangs of `gang` GPUs `node`
        #: can give after `taken` ((gpus, NVLink gang or 0) of this pass's earlier fills on
        #: it, in order); None: no node can (an NVLink bid then never fills).
        self.links = None

    # ------------------------------------------------------------------ submit

    def buy(self, id: int, owner: int, price: int, gpus: int, gang: int, duration_s: int,
            seq: int, now: int, fills: list, cancelled: list, tif: str = "GTC",
            min_cuda: int = 0, nvlink: bool = False, min_rel: int = 0, avoid_node: int = 0,
            image_only: bool = False, node: int = 0, prefer: frozenset[int] = _NO_NODES,
            _mirror: Bid | None = None) -> int:
        """``submit_bid`` for plain ints: the fast path (no ``Bid``, no ``MatchResult``).

        Args: ``Bid``'s fields (same meaning, same checks), ``now`` (epoch seconds), and
        two lists the book appends to: ``fills`` gets one tuple ``(bid_id, ask_id, node,
        gpus, price)`` per trade (``Fill``'s fields, in matching order), ``cancelled`` the
        ids of resting asks that self-trade prevention cancelled. ``prefer`` is read only
        now (``Bid.prefer``, prefer_walk.py); a resting bid does not keep it.

        Returns:
            GPUs left unfilled: with GTC they rest (``bids()`` shows a ``Bid``); with IOC
            they are dropped; with FOK a non-zero result means killed (nothing changed).

        Raises:
            ValueError: invalid fields or a duplicate id; nothing changes.
        """
        if (price <= 0 or gpus <= 0 or gang <= 0 or gpus % gang or duration_s <= 0
                or tif not in TIME_IN_FORCE):
            raise ValueError(f"invalid bid {_mirror!r}" if _mirror is not None else
                             f"invalid bid: id={id} price={price} gpus={gpus} gang={gang} "
                             f"duration_s={duration_s} tif={tif!r}")
        ix = self._ix
        if id in ix:
            raise ValueError(f"duplicate order id {id}")
        c = [gpus, owner, id, seq, price, gang, duration_s, min_cuda, min_rel, avoid_node,
             image_only, node, nvlink, tif, _mirror]
        px = self._ask_px
        if px and px[0] <= price and (
                gang < self._gmin or owner in self._ask_own
                or self._ask_lo[gang if gang < _GE_TOP else _GE_TOP] <= price):
            # (a gang bid skips the walk when no ask at or below its price holds a whole
            # gang and none is its owner's: most gang bids of a book crossed by leftovers)
            if tif == "FOK" and self._bid_fillable(c, now) < gpus:
                return gpus
            left = (self._take_preferring(c, now, fills, cancelled, prefer) if prefer
                    else self._take_asks(c, now, fills, cancelled))
            if not left or tif != "GTC":
                return left
            c[0] = left
        elif tif != "GTC":
            return gpus
        else:
            left = gpus
        # rest (inline _rest and _rested_bid: the hot path)
        lvs = self._bid_lv
        lr = lvs.get(price)
        if lr is None:
            insort(self._bid_px, price)
            lvs[price] = [deque((c,)), left, gang, None, gang]
        else:
            lr[1] += left
            q = lr[0]
            while not q[-1][0]:  # dead tail cells: drop them (a level holds a live one)
                q.pop()
            lv = lr[3]
            if q[-1][3] > seq:
                _insert(q, c, seq)
                lr[3] = None  # not at the tail: the level's index is rebuilt
            else:
                q.append(c)
                if lv is not None:
                    for v, d in lv.items():
                        if gang <= v:
                            d.append(c)
                    n = self._bid_gen + len(lv)
                    self._bid_gen = n
                    if n > _GE_SLACK + 16 * len(ix):
                        _ge_gc(self)
            if lr[2] > gang:
                lr[2] = gang
            if lr[4] < gang:
                lr[4] = gang
        ix[id] = c
        own = self._bid_own
        own[owner] = own.get(owner, 0) + 1
        return left

    def sell(self, id: int, owner: int, price: int, gpus: int, node: int,
             available_until: int, seq: int, now: int, fills: list, cancelled: list,
             cuda: int = 0, rel: int = 1000, runs_images: bool = True,
             _mirror: Ask | None = None) -> int:
        """``submit_ask`` for plain ints: the fast path (no ``Ask``, no ``MatchResult``).

        Args: ``Ask``'s fields, ``now``, and the lists ``fills`` (tuples ``(bid_id, ask_id,
        node, gpus, price)``, at the resting bids' prices) and ``cancelled`` (resting bids
        cancelled by self-trade prevention) that the book appends to.

        Returns:
            GPUs left; they rest (asks are always GTC).

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        if price <= 0 or gpus <= 0:
            raise ValueError(f"invalid ask {_mirror!r}" if _mirror is not None else
                             f"invalid ask: id={id} price={price} gpus={gpus}")
        ix = self._ix
        if id in ix:
            raise ValueError(f"duplicate order id {id}")
        c = [gpus, owner, id, seq, price, node, available_until, cuda, rel, runs_images,
             _mirror]
        px = self._bid_px
        if px and px[-1] >= price:
            left = self._take_bids(c, now, fills, cancelled)
            if not left:
                return 0
            c[0] = left
        else:
            left = gpus
        # rest (inline _rest and _rested_ask: the hot path)
        lvs = self._ask_lv
        lr = lvs.get(price)
        if lr is None:
            insort(self._ask_px, price)
            lvs[price] = [deque((c,)), left, left, None]
        else:
            lr[1] += left
            q = lr[0]
            while not q[-1][0]:  # dead tail cells: drop them (a level holds a live one)
                q.pop()
            lv = lr[3]
            if q[-1][3] > seq:
                _insert(q, c, seq)
                lr[3] = None  # not at the tail: the level's index is rebuilt
            else:
                q.append(c)
                if lv is not None:
                    if left >= _GE_TOP:  # in every bucket
                        for d in lv.values():
                            d.append(c)
                    else:
                        for v, d in lv.items():
                            if left >= v:
                                d.append(c)
                    n = self._ask_gen + len(lv)
                    self._ask_gen = n
                    if n > _GE_SLACK + 16 * len(ix):
                        _ge_gc(self)
            if lr[2] < left:
                lr[2] = left
        ix[id] = c
        own = self._ask_own
        own[owner] = own.get(owner, 0) + 1
        lo = self._ask_lo
        if lo[left if left < _GE_TOP else _GE_TOP] > price:
            _lower_lo(lo, price, left)
        return left

    def submit_bid(self, bid: Bid, now: int) -> MatchResult:
        """Match an incoming bid against resting asks, then apply its time in force.

        Args:
            bid: the buy order; ``bid.gpus`` is set to what is left (unless killed); a
                resting bid's ``gpus`` follows its later fills.
            now: current time, epoch seconds (for the ask windows).

        Returns:
            ``MatchResult``; ``remaining`` is what was not filled; ``rested`` only for GTC
            with a remainder; FOK that cannot fill whole: no change, ``killed=True``.

        Raises:
            ValueError: invalid bid (see class docstring); nothing changes.
        """
        fills: list = []
        stc: list[int] = []
        tif = bid.tif
        left = self.buy(bid.id, bid.owner, bid.price, bid.gpus, bid.gang, bid.duration_s,
                        bid.seq, now, fills, stc, tif, bid.min_cuda, bid.nvlink, bid.min_rel,
                        bid.avoid_node, bid.image_only, bid.node, bid.prefer, bid)
        bid.gpus = left
        return MatchResult([Fill(*f) for f in fills], bool(left) and tif == "GTC", stc,
                           left, bool(left) and tif == "FOK")

    def submit_ask(self, ask: Ask, now: int) -> MatchResult:
        """Match an incoming ask against resting bids; its remainder rests (always GTC).

        Args:
            ask: the sell order (one node's GPUs); ``ask.gpus`` is set to what is left
                (and follows its later fills while it rests).
            now: current time, epoch seconds (a bid fits if ``now + duration_s <=
                ask.available_until``).

        Returns:
            ``MatchResult``; each fill is at the resting bid's price.

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        fills: list = []
        stc: list[int] = []
        left = self.sell(ask.id, ask.owner, ask.price, ask.gpus, ask.node,
                         ask.available_until, ask.seq, now, fills, stc, ask.cuda, ask.rel,
                         ask.runs_images, ask)
        ask.gpus = left
        return MatchResult([Fill(*f) for f in fills], bool(left), stc, left)
