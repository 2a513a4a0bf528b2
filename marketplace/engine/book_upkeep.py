"""Upkeep of the order book (a mixin of ``marketplace.engine.book.OrderBook``; every
attribute it reads is a slot there): resting orders straight in without matching (a
saved book's load), cancels, GPUs given back to an ask and its re-match, expiry.

Cells, levels and fill tuples are laid out as in ``walks.py``; units as in ``types.py``
(integer micro-USD per GPU-hour, GPU counts, epoch seconds).
"""

from __future__ import annotations

from bisect import bisect_left

import marketplace.engine.walks as walks  # the module: tests tune its constants

from .gang_walks import _lower_lo
from .types import Ask, Bid, Fill, MatchResult
from .walks import _dec, _drop_level, _rest


class BookUpkeep:
    """``rest_bid``/``rest_ask`` (plain ints: ``rest_buy``/``rest_sell``), ``cancel``,
    ``add_gpus_to_ask``, ``rematch_ask``, ``expire``."""

    __slots__ = ()

    def rest_bid(self, bid: Bid) -> None:
        """Put a bid straight into the book, WITHOUT matching (rebuilding a saved book).

        For loading resting orders that were already matched when they arrived (e.g. the
        database's open orders, in any order: ``seq`` decides time priority). ``tif`` is
        not consulted. Nothing is checked against the other side, so the caller must only
        rest orders that the matching rules left resting. ``bid.gpus`` follows its fills.

        Raises:
            ValueError: invalid bid (see class docstring) or duplicate id; nothing changes.
        """
        self.rest_buy(bid.id, bid.owner, bid.price, bid.gpus, bid.gang, bid.duration_s,
                      bid.seq, bid.tif, bid.min_cuda, bid.nvlink, bid.min_rel,
                      bid.avoid_node, bid.image_only, bid.node, bid)

    def rest_buy(self, id: int, owner: int, price: int, gpus: int, gang: int,
                 duration_s: int, seq: int, tif: str = "GTC", min_cuda: int = 0,
                 nvlink: bool = False, min_rel: int = 0, avoid_node: int = 0,
                 image_only: bool = False, node: int = 0,
                 _mirror: Bid | None = None) -> None:
        """``rest_bid`` for plain ints (``Bid``'s fields; no ``Bid`` is built until
        ``bids()`` asks for one): what a saved book's load calls per resting bid.

        Raises:
            ValueError: invalid fields or a duplicate id; nothing changes.
        """
        if price <= 0 or gpus <= 0 or gang <= 0 or gpus % gang or duration_s <= 0:
            raise ValueError(f"invalid bid: id={id} price={price} gpus={gpus} gang={gang} "
                             f"duration_s={duration_s}")
        if id in self._ix:
            raise ValueError(f"duplicate order id {id}")
        cell = [gpus, owner, id, seq, price, gang, duration_s, min_cuda, min_rel,
                avoid_node, image_only, node, nvlink, tif, _mirror]
        lv = _rest(self._bid_px, self._bid_lv, cell, price, seq, gpus, [gang, None, gang])
        self._ix[id] = cell
        lv[3] = None  # the level's index: rebuilt when an ask next walks the level
        self._rested_bid(cell, lv)

    def rest_ask(self, ask: Ask) -> None:
        """Put an ask straight into the book, WITHOUT matching (rebuilding a saved book).

        Same contract as ``rest_bid``; ``ask.gpus`` follows its fills.

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        self.rest_sell(ask.id, ask.owner, ask.price, ask.gpus, ask.node,
                       ask.available_until, ask.seq, ask.cuda, ask.rel, ask.runs_images, ask)

    def rest_sell(self, id: int, owner: int, price: int, gpus: int, node: int,
                  available_until: int, seq: int, cuda: int = 0, rel: int = 1000,
                  runs_images: bool = True, _mirror: Ask | None = None) -> None:
        """``rest_ask`` for plain ints (``Ask``'s fields; no ``Ask`` is built until
        ``asks()`` asks for one).

        Raises:
            ValueError: non-positive price or gpus, or a duplicate id; nothing changes.
        """
        if price <= 0 or gpus <= 0:
            raise ValueError(f"invalid ask: id={id} price={price} gpus={gpus}")
        if id in self._ix:
            raise ValueError(f"duplicate order id {id}")
        cell = [gpus, owner, id, seq, price, node, available_until, cuda, rel, runs_images,
                _mirror]
        lv = _rest(self._ask_px, self._ask_lv, cell, price, seq, gpus, [gpus, None])
        self._ix[id] = cell
        lv[3] = None  # the level's index: rebuilt when a gang bid next walks the level
        self._rested_ask(cell, lv)

    def _rested_bid(self, c: list, lv: list) -> None:
        """Book-keeping of a bid cell just rested in level ``lv``: its owner's count, the
        level's gang bounds."""
        own = self._bid_own
        own[c[1]] = own.get(c[1], 0) + 1
        gang = c[5]
        if lv[2] > gang:
            lv[2] = gang
        if lv[4] < gang:
            lv[4] = gang

    def _rested_ask(self, c: list, lv: list) -> None:
        """Book-keeping of an ask cell just (re)rested in level ``lv``: owner's count, the
        level's GPU bound, ``_ask_lo``."""
        own = self._ask_own
        own[c[1]] = own.get(c[1], 0) + 1
        gpus = c[0]
        if lv[2] < gpus:
            lv[2] = gpus
        _lower_lo(self._ask_lo, c[4], gpus)

    def cancel(self, order_id: int) -> bool:
        """Remove a resting bid or ask by id; ``False`` if no such order rests."""
        c = self._ix.pop(order_id, None)
        if c is None:
            return False
        p = c[4]
        if len(c) == 15:  # a bid cell (walks.py)
            own = self._bid_own
            lvs = self._bid_lv
        else:
            own = self._ask_own
            lvs = self._ask_lv
        o = c[1]
        n = own[o] - 1
        if n:
            own[o] = n
        else:
            del own[o]
        lv = lvs[p]
        tot = lv[1] - c[0]
        c[0] = 0
        if not tot:
            px = self._bid_px if lvs is self._bid_lv else self._ask_px
            del px[bisect_left(px, p)]
            del lvs[p]
            return True
        lv[1] = tot
        q = lv[0]
        if q[0] is c:
            q.popleft()
        elif lvs is self._bid_lv:  # a dead cell off the head stays until a walk or compaction
            n = self._bid_dead + 1
            if n > walks._COMPACT_MIN + 2 * len(self._ix):
                self._compact(lvs)
                n = 0
            self._bid_dead = n
        else:
            n = self._ask_dead + 1
            if n > walks._COMPACT_MIN + 2 * len(self._ix):
                self._compact(lvs)
                n = 0
            self._ask_dead = n
        return True

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
        cell = self._ix.get(ask_id)
        if cell is None or len(cell) != 11:  # none, or a bid's (walks.py)
            return False
        have = cell[0] + gpus
        cell[0] = have
        if cell[10] is not None:
            cell[10].gpus = have
        p = cell[4]
        lv = self._ask_lv[p]
        lv[1] += gpus
        lv[3] = None  # it may now belong to more buckets: the index is rebuilt when used
        _lower_lo(self._ask_lo, p, have)
        if lv[2] < have:
            lv[2] = have
        return True

    def rematch_ask(self, ask_id: int, now: int) -> MatchResult:
        """Match a resting ask against resting bids as if it had just arrived.

        Same rules as ``submit_ask`` (trade at the resting bids' prices, self-trade
        prevention cancels the bids of the ask's owner), but the ask keeps its own
        ``seq`` time priority when its remainder rests again.

        Raises:
            KeyError: no resting ask with that id.
        """
        cell = self._ix[ask_id]
        if len(cell) != 11:  # a bid's cell (walks.py)
            raise KeyError(ask_id)
        del self._ix[ask_id]
        _dec(self._ask_own, cell[1])
        a = cell[:]  # the ask walks (and rests again) as a new cell; the old one dies
        cell[0] = 0
        p = a[4]
        lv = self._ask_lv[p]
        lv[3] = None  # it rests again with its old seq: the index is rebuilt when used
        tot = lv[1] - a[0]
        if tot:
            lv[1] = tot
            q = lv[0]
            for j, c in enumerate(q):
                if c is cell:
                    del q[j]
                    break
        else:
            _drop_level(self._ask_px, self._ask_lv, p)
        fills: list = []
        stc: list[int] = []
        bpx = self._bid_px
        left = self._take_bids(a, now, fills, stc) if bpx and bpx[-1] >= p else a[0]
        a[0] = left
        if a[10] is not None:
            a[10].gpus = left
        fills = [Fill(*f) for f in fills]
        if left:
            lv = _rest(self._ask_px, self._ask_lv, a, p, a[3], left, [left, None])
            lv[3] = None
            self._ix[ask_id] = a
            self._rested_ask(a, lv)
            return MatchResult(fills, True, stc, left)
        return MatchResult(fills, False, stc, 0)

    def expire(self, now: int) -> list[int]:
        """Cancel the asks whose window has closed (``available_until <= now``).

        Such an ask can never match (every bid has ``duration_s > 0``). Returns the ids
        removed, in priority order. O(resting asks); call it periodically.
        """
        lvs = self._ask_lv
        gone = [c[2] for p in self._ask_px for c in lvs[p][0] if c[0] and c[6] <= now]
        for ask_id in gone:
            self.cancel(ask_id)
        return gone
