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
price a deque of one-element list "cells" ``[order]`` in seq order plus the total GPUs at
that price. Cancels are lazy (the cell is emptied, ``[None]``) and dead cells are
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

from collections import deque

from .gang_walks import GangWalks, _ge_gc, _lower_lo
from .prefer_walk import PreferWalks
from .types import TIME_IN_FORCE, Ask, Bid, Fill, MatchResult
from .walks import _BIG, _GE_TOP, Walks, _dec, _drop_level, _rest

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

    def submit_bid(self, bid: Bid, now: int) -> MatchResult:
        """Match an incoming bid against resting asks, then apply its time in force.

        Args:
            bid: the buy order; ``bid.gpus`` is decremented by what fills (unless killed).
            now: current time, epoch seconds (for the ask windows).

        Returns:
            ``MatchResult``; ``remaining`` is what was not filled; ``rested`` only for GTC
            with a remainder; FOK that cannot fill whole: no change, ``killed=True``.

        Raises:
            ValueError: invalid bid (see class docstring); nothing changes.
        """
        price = bid.price
        gpus = bid.gpus
        gang = bid.gang
        tif = bid.tif
        if (
            price <= 0
            or gpus <= 0
            or gang <= 0
            or gpus % gang
            or bid.duration_s <= 0
            or tif not in TIME_IN_FORCE
        ):
            raise ValueError(f"invalid bid {bid!r}")
        bid_id = bid.id
        if bid_id in self._bid_ix or bid_id in self._ask_ix:
            raise ValueError(f"duplicate order id {bid_id}")
        fills: list[Fill] = []
        stc: list[int] = []
        px = self._ask_px
        if px and px[0] <= price:
            if tif == "FOK" and self._bid_fillable(bid, now) < gpus:
                return MatchResult(fills, False, stc, gpus, True)
            left = (self._take_preferring(bid, now, fills, stc) if bid.prefer
                    else self._take_asks(bid, now, fills, stc))
        else:
            if tif == "FOK":
                return MatchResult(fills, False, stc, gpus, True)
            left = gpus
        bid.gpus = left
        if left and tif == "GTC":
            cell = [bid]
            moved = _rest(self._bid_px, self._bid_q, self._bid_tot, cell, price, bid.seq, left)
            self._bid_ix[bid_id] = cell
            lv = self._bid_ge.get(price)
            if lv is not None:
                if moved:  # not at the tail: the level's index is rebuilt when next used
                    del self._bid_ge[price]
                else:
                    for v, d in lv.items():
                        if gang <= v:
                            d.append(cell)
                    self._bid_gen += len(lv)
                    _ge_gc(self)
            own = self._bid_own  # inline _rested_bid (the hot path)
            owner = bid.owner
            own[owner] = own.get(owner, 0) + 1
            mg = self._bid_mingang
            if mg.get(price, _BIG) > gang:
                mg[price] = gang
            mg = self._bid_maxgang
            if mg.get(price, 0) < gang:
                mg[price] = gang
            return MatchResult(fills, True, stc, left)
        return MatchResult(fills, False, stc, left)

    def submit_ask(self, ask: Ask, now: int) -> MatchResult:
        """Match an incoming ask against resting bids; its remainder rests (always GTC).

        Args:
            ask: the sell order (one node's GPUs); ``ask.gpus`` is decremented by fills.
            now: current time, epoch seconds (a bid fits if ``now + duration_s <=
                ask.available_until``).

        Returns:
            ``MatchResult``; each fill is at the resting bid's price.

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        price = ask.price
        gpus = ask.gpus
        if price <= 0 or gpus <= 0:
            raise ValueError(f"invalid ask {ask!r}")
        ask_id = ask.id
        if ask_id in self._ask_ix or ask_id in self._bid_ix:
            raise ValueError(f"duplicate order id {ask_id}")
        fills: list[Fill] = []
        stc: list[int] = []
        px = self._bid_px
        left = self._take_bids(ask, now, fills, stc) if px and px[-1] >= price else gpus
        ask.gpus = left
        if left:
            cell = [ask]
            moved = _rest(self._ask_px, self._ask_q, self._ask_tot, cell, price, ask.seq, left)
            self._ask_ix[ask_id] = cell
            lv = self._ask_ge.get(price)
            if lv is not None:
                if moved:  # not at the tail: the level's index is rebuilt when next used
                    del self._ask_ge[price]
                else:
                    for v, d in lv.items():
                        if left >= v:
                            d.append(cell)
                    self._ask_gen += len(lv)
                    _ge_gc(self)
            own = self._ask_own  # inline _rested_ask (the hot path)
            owner = ask.owner
            own[owner] = own.get(owner, 0) + 1
            cap = self._ask_cap
            if cap.get(price, 0) < left:
                cap[price] = left
            lo = self._ask_lo
            if lo[left if left < _GE_TOP else _GE_TOP] > price:
                _lower_lo(lo, price, left)
            return MatchResult(fills, True, stc, left)
        return MatchResult(fills, False, stc, 0)

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
        cell = [bid]
        _rest(self._bid_px, self._bid_q, self._bid_tot, cell, bid.price, bid.seq, gpus)
        self._bid_ix[bid.id] = cell
        self._bid_ge.pop(bid.price, None)  # rebuilt when an ask next walks the level
        self._rested_bid(bid)

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
        cell = [ask]
        _rest(self._ask_px, self._ask_q, self._ask_tot, cell, ask.price, ask.seq, ask.gpus)
        self._ask_ix[ask.id] = cell
        self._ask_ge.pop(ask.price, None)  # rebuilt when a gang bid next walks the level
        self._rested_ask(ask)

    def _rested_bid(self, bid: Bid) -> None:
        """Book-keeping of a bid just rested: its owner's count, its level's gang bound."""
        own = self._bid_own
        own[bid.owner] = own.get(bid.owner, 0) + 1
        mg = self._bid_mingang
        m = mg.get(bid.price)
        if m is None or m > bid.gang:
            mg[bid.price] = bid.gang
        if self._bid_maxgang.get(bid.price, 0) < bid.gang:
            self._bid_maxgang[bid.price] = bid.gang

    def _rested_ask(self, ask: Ask) -> None:
        """Book-keeping of an ask just (re)rested: owner's count, its level's GPU bound."""
        own = self._ask_own
        own[ask.owner] = own.get(ask.owner, 0) + 1
        cap = self._ask_cap
        c = cap.get(ask.price)
        if c is None or c < ask.gpus:
            cap[ask.price] = ask.gpus
        _lower_lo(self._ask_lo, ask.price, ask.gpus)

    # ------------------------------------------------------------------ maintenance

    def cancel(self, order_id: int) -> bool:
        """Remove a resting bid or ask by id; ``False`` if no such order rests."""
        cell = self._bid_ix.pop(order_id, None)
        if cell is not None:
            own = self._bid_own
            owner = cell[0].owner
            n = own[owner] - 1
            if n:
                own[owner] = n
            else:
                del own[owner]
            self._unlink(cell, self._bid_px, self._bid_q, self._bid_tot, bid=True)
            return True
        cell = self._ask_ix.pop(order_id, None)
        if cell is not None:
            _dec(self._ask_own, cell[0].owner)
            self._unlink(cell, self._ask_px, self._ask_q, self._ask_tot, bid=False)
            return True
        return False

    def _unlink(self, cell: list, px: list, qs: dict, tots: dict, *, bid: bool) -> None:
        """Kill a resting cell already removed from the id index."""
        o = cell[0]
        cell[0] = None
        p = o.price
        tot = tots[p] - o.gpus
        if not tot:
            _drop_level(px, qs, tots, p, self._bid_mingang if bid else self._ask_cap)
            if bid:
                self._bid_ge.pop(p, None)
                self._bid_maxgang.pop(p, None)
            else:
                self._ask_ge.pop(p, None)
            return
        tots[p] = tot
        q = qs[p]
        if q[0] is cell:
            q.popleft()
        elif bid:
            self._bid_dead += 1
            self._maybe_compact()
        else:
            self._ask_dead += 1
            self._maybe_compact()

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
        a = cell[0]
        a.gpus += gpus
        self._ask_tot[a.price] += gpus
        self._ask_ge.pop(a.price, None)  # it may now belong to more buckets
        _lower_lo(self._ask_lo, a.price, a.gpus)
        if self._ask_cap[a.price] < a.gpus:
            self._ask_cap[a.price] = a.gpus
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
        a = cell[0]
        _dec(self._ask_own, a.owner)
        cell[0] = None
        p = a.price
        self._ask_ge.pop(p, None)  # it rests again with its old seq: rebuilt when used
        tot = self._ask_tot[p] - a.gpus
        if tot:
            self._ask_tot[p] = tot
            q = self._ask_q[p]
            for j, c in enumerate(q):
                if c is cell:
                    del q[j]
                    break
        else:
            _drop_level(self._ask_px, self._ask_q, self._ask_tot, p, self._ask_cap)
        fills: list[Fill] = []
        stc: list[int] = []
        bpx = self._bid_px
        left = self._take_bids(a, now, fills, stc) if bpx and bpx[-1] >= p else a.gpus
        a.gpus = left
        if left:
            cell = [a]
            _rest(self._ask_px, self._ask_q, self._ask_tot, cell, p, a.seq, left)
            self._ask_ix[ask_id] = cell
            self._rested_ask(a)
            return MatchResult(fills, True, stc, left)
        return MatchResult(fills, False, stc, 0)

    def expire(self, now: int) -> list[int]:
        """Cancel the asks whose window has closed (``available_until <= now``).

        Such an ask can never match (every bid has ``duration_s > 0``). Returns the ids
        removed, in priority order. O(resting asks); call it periodically.
        """
        gone = [a.id for a in self.asks() if a.available_until <= now]
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
        """Resting bids in priority order (price high→low, then seq)."""
        qs = self._bid_q
        return [c[0] for p in reversed(self._bid_px) for c in qs[p] if c[0] is not None]

    def asks(self) -> list[Ask]:
        """Resting asks in priority order (price low→high, then seq)."""
        qs = self._ask_q
        return [c[0] for p in self._ask_px for c in qs[p] if c[0] is not None]

    def __len__(self) -> int:
        """Number of resting orders (bids + asks)."""
        return len(self._bid_ix) + len(self._ask_ix)

    def __contains__(self, order_id: object) -> bool:
        """Whether a bid or ask with this id rests in the book."""
        return order_id in self._bid_ix or order_id in self._ask_ix
