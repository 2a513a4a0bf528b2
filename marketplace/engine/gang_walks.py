"""The order book's walks through its level indexes for gangs (``OrderBook._ask_ge``,
``_bid_ge``, ``_ask_lo``; book.py's module docstring has the structure). ``GangWalks`` is
a mixin: every attribute it reads is an ``OrderBook`` slot.

Units: prices integer micro-USD per GPU-hour, GPUs counts, times epoch seconds.
"""

from __future__ import annotations

from collections import deque

from .types import Ask, Bid, Fill
from .walks import _BIG, _GE_TOP, _dec

_GE_SLACK = 4096  # index entries appended past 16 x live asks before a rebuild


def _ge_gc(book) -> None:
    """Drop every level index of a side once its appends outgrow the live orders (its
    stale entries are then bounded; the indexes rebuild lazily, amortised O(1))."""
    if book._ask_gen > _GE_SLACK + 16 * len(book._ask_ix):
        book._ask_ge.clear()
        book._ask_gen = 0
    if book._bid_gen > _GE_SLACK + 16 * len(book._bid_ix):
        book._bid_ge.clear()
        book._bid_gen = 0


def _lower_lo(lo: list[int], price: int, gpus: int) -> None:
    """An ask of ``gpus`` GPUs rests at ``price``: lower ``lo[v]`` (the price below which
    no ask holds v GPUs; non-decreasing in v) for every v it holds."""
    v = gpus if gpus < _GE_TOP else _GE_TOP
    while v > 1 and lo[v] > price:
        lo[v] = price
        v -= 1


def _build_ge(q: deque, v: int) -> deque:
    """The cells of level deque ``q`` whose ask holds at least ``v`` GPUs, in seq order."""
    return deque(c for c in q if c[0] is not None and c[0].gpus >= v)


class GangWalks:
    """One level's walk through its index, for a gang bid or an ask with few GPUs."""

    __slots__ = ()

    def _take_ge(self, bid: Bid, p: int, q: deque, left: int, tot: int, dead: int,
                 fills: list, end: int) -> tuple[int, int, int, int]:
        """``_take_asks`` on level ``p`` through its index of asks holding >= v GPUs
        (v = min(gang, 8); built on first use, kept by every rest at the level, entries
        stale once their ask holds fewer, dropped lazily). Only for a bid whose owner
        rests no ask (no self-trade to find). Returns (left, tot, level GPU bound, dead):
        the bound is exact up to v - 1 (the asks outside the index) when walked whole."""
        gang = bid.gang
        v = gang if gang < _GE_TOP else _GE_TOP
        lv = self._ask_ge.get(p)
        if lv is None:
            lv = self._ask_ge[p] = {}
        d = lv.get(v)
        if d is None:
            d = lv[v] = _build_ge(q, v)
            self._ask_gen += len(d)
        ix = self._ask_ix
        own = self._ask_own
        bid_id = bid.id
        need = bid.min_cuda
        mrel = bid.min_rel
        avoid = bid.avoid_node
        image = bid.image_only
        only = bid.node
        nv = bid.nvlink
        mx = 0
        j = 0
        n = len(d)
        while j < n:
            cell = d[j]
            a = cell[0]
            if a is None or a.gpus < v:  # gone, or no longer holds v GPUs: stale entry
                if j:
                    j += 1
                else:
                    d.popleft()
                    n -= 1
                continue
            ag = a.gpus
            if (ag < gang or end > a.available_until or (need and a.cuda < need)
                    or (mrel and a.rel < mrel) or (avoid and a.node == avoid)
                    or (image and not a.runs_images) or (only and a.node != only)):
                if ag > mx:
                    mx = ag
                j += 1
                continue
            k = ag // gang
            lg = left // gang
            if k > lg:
                k = lg
            if nv:
                k = self._nvlink_gangs(a.node, gang, k, fills, {bid_id: gang})
                if not k:
                    if ag > mx:
                        mx = ag
                    j += 1
                    continue
            g = k * gang
            fills.append(Fill(bid_id, a.id, a.node, g, p))
            left -= g
            tot -= g
            if ag != g:
                a.gpus = ag - g
                if not left:
                    break
                if ag - g > mx:
                    mx = ag - g
                j += 1
                continue
            cell[0] = None
            del ix[a.id]
            _dec(own, a.owner)
            if q[0] is cell:
                q.popleft()
            else:
                dead += 1
            if j:
                j += 1
            else:
                d.popleft()
                n -= 1
            if not left:
                break
        if mx < v - 1:
            mx = v - 1
        return left, tot, mx, dead

    def _take_gb(self, ask: Ask, p: int, q: deque, left: int, tot: int, dead: int,
                 fills: list, nvg: dict, window: int, top: int) -> tuple[int, int, int, int]:
        """``_take_bids`` on level ``p`` through its index of bids of gang <= v (v = GPUs
        the ask has left, < 8; the level's deque itself while 8 or more; gangs never
        change, so entries only die); when a fill leaves fewer GPUs, the walk moves on in
        the smaller index after the last seq seen.
        Only for an ask whose owner rests no bid. Returns (left, tot, gang bound, dead):
        the bound is exact down to v + 1 (the bids outside the index) when walked whole."""
        lv = self._bid_ge.get(p)
        if lv is None:
            lv = self._bid_ge[p] = {}
        ix = self._bid_ix
        own = self._bid_own
        ask_id = ask.id
        node = ask.node
        cuda = ask.cuda
        rel = ask.rel
        processes = not ask.runs_images
        mn = _BIG
        last = -_BIG  # seq of the last bid looked at
        v = 0
        while left:
            # _BIG: the whole level, q itself (no index leaves out a bid: `top`, a bound
            # of the level's gangs, is <= left, or left >= 8)
            want = left if left < _GE_TOP and left < top else _BIG
            if want != v:  # (re)start in the index of gangs <= left
                v = want
                d = q if v == _BIG else lv.get(v)
                if d is None:
                    d = lv[v] = deque(c for c in q if c[0] is not None and c[0].gang <= v)
                    self._bid_gen += len(d)
                j = 0
                n = len(d)
            if j >= n:
                break
            cell = d[j]
            b = cell[0]
            if b is None:
                if j:
                    j += 1
                else:
                    d.popleft()
                    n -= 1
                continue
            if b.seq <= last:  # seen before the move to this index
                j += 1
                continue
            last = b.seq
            bg = b.gpus
            gang = b.gang
            if (gang > left or b.duration_s > window or b.min_cuda > cuda
                    or b.min_rel > rel or b.avoid_node == node
                    or (processes and b.image_only) or (b.node and b.node != node)):
                if gang < mn:
                    mn = gang
                j += 1
                continue
            k = left // gang
            kb = bg // gang
            if k > kb:
                k = kb
            if b.nvlink:
                nvg[b.id] = gang
                k = self._nvlink_gangs(node, gang, k, fills, nvg)
                if not k:
                    if gang < mn:
                        mn = gang
                    j += 1
                    continue
            g = k * gang
            fills.append(Fill(b.id, ask_id, node, g, p))
            left -= g
            tot -= g
            if bg != g:
                b.gpus = bg - g
                if gang < mn:
                    mn = gang
                j += 1
                continue
            cell[0] = None
            del ix[b.id]
            _dec(own, b.owner)
            if d is not q:
                if q[0] is cell:
                    q.popleft()
                else:
                    dead += 1
            elif j:
                dead += 1
            if j:
                j += 1
            else:
                d.popleft()
                n -= 1
        if v < _BIG and mn > v + 1:
            mn = v + 1
        return left, tot, mn, dead
