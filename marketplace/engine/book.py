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
price a deque of "cells" (plain lists of the order's fields, layout in walks.py) in seq
order plus the total GPUs at that price. ``buy``/``sell`` take plain ints (the fast path);
``submit_bid``/``submit_ask`` wrap them for ``Bid``/``Ask`` objects. Cancels are lazy (the
cell's GPUs set to 0) and dead cells are
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
"""


from __future__ import annotations

from bisect import insort
from collections import deque

import marketplace.engine.walks as walks  # the module: tests tune its constants

from .gang_walks import _GE_SLACK, GangWalks, _ge_gc, _lower_lo
from .prefer_walk import PreferWalks
from .types import TIME_IN_FORCE, Ask, Bid, Fill, MatchResult
from .walks import _BIG, _GE_TOP, Walks, _dec, _drop_level, _insert, _rest

_NO_NODES: frozenset[int] = frozenset()

__all__ = ["OrderBook"]


class OrderBook(Walks, GangWalks, PreferWalks):
    """One GPU class's continuous auction: price-time priority.

    Order ids must be unique across bids and asks of one book (``cancel`` takes either);
    a duplicate id, a non-positive price/gpus/gang/duration, ``gpus`` not a multiple of
    ``gang`` or an unknown ``tif`` raises ``ValueError`` and changes nothing.
    """

    #: bids of at least this gang walk ask levels through their GPU-count index (the
    #: property tests set it out of reach to compare with the plain walk)
    _ge_min_gang = 2

    __slots__ = (
        "_ask_cap",
        "_ask_dead",
        "_ask_ge",
        "_ask_gen",
        "_ask_ix",
        "_ask_lo",
        "_ask_own",
        "_ask_px",
        "_ask_q",
        "_ask_tot",
        "_bid_dead",
        "_bid_ge",
        "_bid_gen",
        "_bid_ix",
        "_bid_maxgang",
        "_bid_mingang",
        "_bid_own",
        "_bid_px",
        "_bid_q",
        "_bid_tot",
        "links",
    )

    def __init__(self) -> None:
        # Bids: prices ascending (best = last); asks: prices ascending (best = first).
        self._bid_px: list[int] = []
        self._bid_q: dict[int, deque[list]] = {}
        self._bid_tot: dict[int, int] = {}
        self._bid_ix: dict[int, list] = {}
        self._bid_dead = 0
        #: per bid price: a lower bound of its resting bids' gangs (exact after a walk)
        self._bid_mingang: dict[int, int] = {}
        #: per bid price: an upper bound of its resting bids' gangs (the gang index is
        #: walked only where it leaves some bid out)
        self._bid_maxgang: dict[int, int] = {}
        self._bid_own: dict[int, int] = {}  # owner -> resting bids
        #: per bid price, built on an ask's first walk there with < 8 GPUs left: {v:
        #: deque of the cells whose bid's gang <= v, seq order} (entries die lazily)
        self._bid_ge: dict[int, dict[int, deque[list]]] = {}
        self._bid_gen = 0  # index entries appended since the last rebuild
        self._ask_px: list[int] = []
        self._ask_q: dict[int, deque[list]] = {}
        self._ask_tot: dict[int, int] = {}
        self._ask_ix: dict[int, list] = {}
        self._ask_dead = 0
        #: per ask price: an upper bound of its resting asks' GPUs (exact after a walk)
        self._ask_cap: dict[int, int] = {}
        self._ask_own: dict[int, int] = {}  # owner -> resting asks
        #: per ask price, built on a gang bid's first walk there: {v: deque of the cells
        #: whose ask held >= v GPUs when indexed, seq order} (entries go stale lazily)
        self._ask_ge: dict[int, dict[int, deque[list]]] = {}
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
        bix = self._bid_ix
        if id in bix or id in self._ask_ix:
            raise ValueError(f"duplicate order id {id}")
        c = [gpus, owner, id, seq, price, gang, duration_s, min_cuda, min_rel, avoid_node,
             image_only, node, nvlink, tif, _mirror]
        px = self._ask_px
        if px and px[0] <= price and (
                gang < self._ge_min_gang or owner in self._ask_own
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
        qs = self._bid_q
        q = qs.get(price)
        if q is None:
            insort(self._bid_px, price)
            qs[price] = deque((c,))
            self._bid_tot[price] = left
            self._bid_mingang[price] = gang
            self._bid_maxgang[price] = gang
        else:
            self._bid_tot[price] += left
            while q and not q[-1][0]:  # dead cells at the tail: drop them, no scan
                q.pop()
            lv = self._bid_ge.get(price)
            if q and q[-1][3] > seq:
                _insert(q, c, seq)
                if lv is not None:  # not at the tail: the level's index is rebuilt
                    del self._bid_ge[price]
            else:
                q.append(c)
                if lv is not None:
                    for v, d in lv.items():
                        if gang <= v:
                            d.append(c)
                    n = self._bid_gen + len(lv)
                    self._bid_gen = n
                    if n > _GE_SLACK + 16 * len(bix):
                        _ge_gc(self)
            mg = self._bid_mingang
            if mg[price] > gang:
                mg[price] = gang
            mg = self._bid_maxgang
            if mg[price] < gang:
                mg[price] = gang
        bix[id] = c
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
        aix = self._ask_ix
        if id in aix or id in self._bid_ix:
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
        qs = self._ask_q
        q = qs.get(price)
        cap = self._ask_cap
        if q is None:
            insort(self._ask_px, price)
            qs[price] = deque((c,))
            self._ask_tot[price] = left
            cap[price] = left
        else:
            self._ask_tot[price] += left
            while q and not q[-1][0]:  # dead cells at the tail: drop them, no scan
                q.pop()
            lv = self._ask_ge.get(price)
            if q and q[-1][3] > seq:
                _insert(q, c, seq)
                if lv is not None:  # not at the tail: the level's index is rebuilt
                    del self._ask_ge[price]
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
                    if n > _GE_SLACK + 16 * len(aix):
                        _ge_gc(self)
            if cap[price] < left:
                cap[price] = left
        aix[id] = c
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

    def rest_bid(self, bid: Bid) -> None:
        """Put a bid straight into the book, WITHOUT matching (rebuilding a saved book).

        For loading resting orders that were already matched when they arrived (e.g. the
        database's open orders, in any order: ``seq`` decides time priority). ``tif`` is
        not consulted. Nothing is checked against the other side, so the caller must only
        rest orders that the matching rules left resting.

        Raises:
            ValueError: invalid bid (see class docstring) or duplicate id; nothing changes.
        """
        gpus = bid.gpus
        gang = bid.gang
        if bid.price <= 0 or gpus <= 0 or gang <= 0 or gpus % gang or bid.duration_s <= 0:
            raise ValueError(f"invalid bid {bid!r}")
        if bid.id in self._bid_ix or bid.id in self._ask_ix:
            raise ValueError(f"duplicate order id {bid.id}")
        cell = [gpus, bid.owner, bid.id, bid.seq, bid.price, gang, bid.duration_s,
                bid.min_cuda, bid.min_rel, bid.avoid_node, bid.image_only, bid.node,
                bid.nvlink, bid.tif, bid]
        _rest(self._bid_px, self._bid_q, self._bid_tot, cell, bid.price, bid.seq, gpus)
        self._bid_ix[bid.id] = cell
        self._bid_ge.pop(bid.price, None)  # rebuilt when an ask next walks the level
        self._rested_bid(cell)

    def rest_ask(self, ask: Ask) -> None:
        """Put an ask straight into the book, WITHOUT matching (rebuilding a saved book).

        Same contract as ``rest_bid``.

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        if ask.price <= 0 or ask.gpus <= 0:
            raise ValueError(f"invalid ask {ask!r}")
        if ask.id in self._ask_ix or ask.id in self._bid_ix:
            raise ValueError(f"duplicate order id {ask.id}")
        cell = [ask.gpus, ask.owner, ask.id, ask.seq, ask.price, ask.node,
                ask.available_until, ask.cuda, ask.rel, ask.runs_images, ask]
        _rest(self._ask_px, self._ask_q, self._ask_tot, cell, ask.price, ask.seq, ask.gpus)
        self._ask_ix[ask.id] = cell
        self._ask_ge.pop(ask.price, None)  # rebuilt when a gang bid next walks the level
        self._rested_ask(cell)

    def _rested_bid(self, c: list) -> None:
        """Book-keeping of a bid cell just rested: its owner's count, its level's gang
        bounds."""
        own = self._bid_own
        own[c[1]] = own.get(c[1], 0) + 1
        price = c[4]
        gang = c[5]
        mg = self._bid_mingang
        m = mg.get(price)
        if m is None or m > gang:
            mg[price] = gang
        if self._bid_maxgang.get(price, 0) < gang:
            self._bid_maxgang[price] = gang

    def _rested_ask(self, c: list) -> None:
        """Book-keeping of an ask cell just (re)rested: owner's count, its level's GPU
        bound."""
        own = self._ask_own
        own[c[1]] = own.get(c[1], 0) + 1
        cap = self._ask_cap
        price = c[4]
        gpus = c[0]
        m = cap.get(price)
        if m is None or m < gpus:
            cap[price] = gpus
        _lower_lo(self._ask_lo, price, gpus)

    # ------------------------------------------------------------------ maintenance

    def cancel(self, order_id: int) -> bool:
        """Remove a resting bid or ask by id; ``False`` if no such order rests."""
        c = self._bid_ix.pop(order_id, None)
        if c is not None:  # (a dead cell off the head stays until a walk or compaction)
            own = self._bid_own
            o = c[1]
            n = own[o] - 1
            if n:
                own[o] = n
            else:
                del own[o]
            p = c[4]
            tots = self._bid_tot
            tot = tots[p] - c[0]
            c[0] = 0
            if not tot:
                _drop_level(self._bid_px, self._bid_q, tots, p, self._bid_mingang)
                self._bid_ge.pop(p, None)
                self._bid_maxgang.pop(p, None)
                return True
            tots[p] = tot
            q = self._bid_q[p]
            if q[0] is c:
                q.popleft()
            else:
                self._bid_dead += 1
                if self._bid_dead > walks._COMPACT_MIN + 2 * len(self._bid_ix):
                    self._compact(self._bid_q)
                    self._bid_dead = 0
            return True
        c = self._ask_ix.pop(order_id, None)
        if c is not None:
            own = self._ask_own
            o = c[1]
            n = own[o] - 1
            if n:
                own[o] = n
            else:
                del own[o]
            p = c[4]
            tots = self._ask_tot
            tot = tots[p] - c[0]
            c[0] = 0
            if not tot:
                _drop_level(self._ask_px, self._ask_q, tots, p, self._ask_cap)
                self._ask_ge.pop(p, None)
                return True
            tots[p] = tot
            q = self._ask_q[p]
            if q[0] is c:
                q.popleft()
            else:
                self._ask_dead += 1
                if self._ask_dead > walks._COMPACT_MIN + 2 * len(self._ask_ix):
                    self._compact(self._ask_q)
                    self._ask_dead = 0
            return True
        return False

    def add_gpus_to_ask(self, ask_id: int, gpus: int) -> bool:
        """Give ``gpus`` GPUs (of a lease that ended) back to a still-resting ask.

        DESIGN.md: "GPUs of a lease that ends return to the provider's ask if it still
        stands". Only adds; it does NOT match: call ``rematch_ask(ask_id, now)`` next (or,
        when this returns ``False`` because the ask is gone, submit a new ask).

        Raises:
            ValueError: ``gpus <= 0``.
        """
        if gpus <= 0:
            raise ValueError(f"gpus must be > 0, got {gpus}")
        cell = self._ask_ix.get(ask_id)
        if cell is None:
            return False
        have = cell[0] + gpus
        cell[0] = have
        if cell[10] is not None:
            cell[10].gpus = have
        p = cell[4]
        self._ask_tot[p] += gpus
        self._ask_ge.pop(p, None)  # it may now belong to more buckets
        _lower_lo(self._ask_lo, p, have)
        if self._ask_cap[p] < have:
            self._ask_cap[p] = have
        return True

    def rematch_ask(self, ask_id: int, now: int) -> MatchResult:
        """Match a resting ask against resting bids as if it had just arrived.

        Same rules as ``submit_ask`` (trade at the resting bids' prices, self-trade
        prevention cancels the bids of the ask's owner), but the ask keeps its own
        ``seq`` time priority when its remainder rests again.

        Raises:
            KeyError: no resting ask with that id.
        """
        cell = self._ask_ix.pop(ask_id)
        _dec(self._ask_own, cell[1])
        a = cell[:]  # the ask walks (and rests again) as a new cell; the old one dies
        cell[0] = 0
        p = a[4]
        self._ask_ge.pop(p, None)  # it rests again with its old seq: rebuilt when used
        tot = self._ask_tot[p] - a[0]
        if tot:
            self._ask_tot[p] = tot
            q = self._ask_q[p]
            for j, c in enumerate(q):
                if c is cell:
                    del q[j]
                    break
        else:
            _drop_level(self._ask_px, self._ask_q, self._ask_tot, p, self._ask_cap)
        fills: list = []
        stc: list[int] = []
        bpx = self._bid_px
        left = self._take_bids(a, now, fills, stc) if bpx and bpx[-1] >= p else a[0]
        a[0] = left
        if a[10] is not None:
            a[10].gpus = left
        fills = [Fill(*f) for f in fills]
        if left:
            _rest(self._ask_px, self._ask_q, self._ask_tot, a, p, a[3], left)
            self._ask_ix[ask_id] = a
            self._rested_ask(a)
            return MatchResult(fills, True, stc, left)
        return MatchResult(fills, False, stc, 0)

    def expire(self, now: int) -> list[int]:
        """Cancel the asks whose window has closed (``available_until <= now``).

        Such an ask can never match (every bid has ``duration_s > 0``). Returns the ids
        removed, in priority order. O(resting asks); call it periodically.
        """
        qs = self._ask_q
        gone = [c[2] for p in self._ask_px for c in qs[p] if c[0] and c[6] <= now]
        for ask_id in gone:
            self.cancel(ask_id)
        return gone

    # ------------------------------------------------------------------ views

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
        bt = self._bid_tot
        at = self._ask_tot
        bids = [(p, bt[p]) for p in self._bid_px[::-1][:levels]] if levels > 0 else []
        asks = [(p, at[p]) for p in self._ask_px[:levels]] if levels > 0 else []
        return bids, asks

    def bids(self) -> list[Bid]:
        """Resting bids in priority order (price high→low, then seq): the ``Bid`` each
        was submitted as (made from its fields for one given to ``buy``)."""
        qs = self._bid_q
        out = []
        for p in reversed(self._bid_px):
            for c in qs[p]:
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
        qs = self._ask_q
        out = []
        for p in self._ask_px:
            for c in qs[p]:
                if c[0]:
                    a = c[10]
                    if a is None:
                        a = c[10] = Ask(c[2], c[1], c[4], c[0], c[5], c[6], c[3], c[7],
                                        c[8], c[9])
                    out.append(a)
        return out

    def __len__(self) -> int:
        """Number of resting orders (bids + asks)."""
        return len(self._bid_ix) + len(self._ask_ix)

    def __contains__(self, order_id: object) -> bool:
        """Whether a bid or ask with this id rests in the book."""
        return order_id in self._bid_ix or order_id in self._ask_ix
