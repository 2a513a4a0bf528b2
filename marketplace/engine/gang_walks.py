"""The order book's walks through its level indexes for gangs (each level record's
``[3]``, and ``OrderBook._ask_lo``; book.py's module docstring has the structure).
``GangWalks`` is a mixin: every attribute it reads is an ``OrderBook`` slot; cells, level
records and fill tuples are laid out as in ``walks.py``.

Units: prices integer micro-USD per GPU-hour, GPUs counts, times epoch seconds.
"""

from __future__ import annotations

from collections import deque

from .walks import _BIG, _GE_TOP, _dec

_GE_SLACK = 4096  # index entries appended past 16 x live asks before a rebuild


def _ge_gc(book) -> None:
    """Drop every level index of a side once its appends outgrow the live orders (its
    stale entries are then bounded; the indexes rebuild lazily, amortised O(1))."""
    if book._ask_gen > _GE_SLACK + 16 * len(book._ix):
        for lv in book._ask_lv.values():
            lv[3] = None
        book._ask_gen = 0
    if book._bid_gen > _GE_SLACK + 16 * len(book._ix):
        for lv in book._bid_lv.values():
            lv[3] = None
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
    return deque(c for c in q if c[0] >= v)


class GangWalks:
    """One level's walk through its index, for a gang bid or an ask with few GPUs."""

    __slots__ = ()

    def _take_ge(self, bid_id: int, gang: int, v: int, need: int, mrel: int, avoid: int,
                 image: bool, only: int, nv: bool, p: int, lvr: list, left: int, tot: int,
                 dead: int, fills: list, end: int,
                 start: int) -> tuple[int, int, int, int]:
        """``_take_asks`` on level ``p`` through its index of asks holding >= v GPUs
        (v = min(gang, 8); built on first use, kept by every rest at the level, entries
        stale once their ask holds fewer, dropped lazily) for the bid ``bid_id`` (its
        fields, unpacked by ``_take_asks`` once per walk, not once per level). Only for
        a bid whose owner rests no ask (no self-trade to find). Returns (left, tot, level
        GPU bound, dead): the bound is exact up to v - 1 (the asks outside the index) when
        walked whole. ``fills[start:]`` are this pass's."""
        q = lvr[0]
        lv = lvr[3]
        if lv is None:
            lv = lvr[3] = {}
        d = lv.get(v)
        if d is None:
            d = lv[v] = _build_ge(q, v)
            self._ask_gen += len(d)
        ix = self._ix
        own = self._ask_own
        mx = 0
        j = 0
        n = len(d)
        while j < n:
            a = d[j]
            ag = a[0]
            if ag < v:  # gone, or no longer holds v GPUs: stale entry
                if j:
                    j += 1
                else:
                    d.popleft()
                    n -= 1
                continue
            if (ag < gang or end > a[6] or (need and a[7] < need)
                    or (mrel and a[8] < mrel) or (avoid and a[5] == avoid)
                    or (image and not a[9]) or (only and a[5] != only)):
                if ag > mx:
                    mx = ag
                j += 1
                continue
            k = ag // gang
            lg = left // gang
            if k > lg:
                k = lg
            if nv:
                k = self._nvlink_gangs(a[5], gang, k, fills, {bid_id: gang}, start)
                if not k:
                    if ag > mx:
                        mx = ag
                    j += 1
                    continue
            g = k * gang
            fills.append((bid_id, a[2], a[5], g, p))
            left -= g
            tot -= g
            if ag != g:
                ag -= g
                a[0] = ag
                if a[10] is not None:
                    a[10].gpus = ag
                if not left:
                    break
                if ag > mx:
                    mx = ag
                j += 1
                continue
            a[0] = 0
            del ix[a[2]]
            _dec(own, a[1])
            if q[0] is a:
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

    def _take_gb(self, ask_id: int, node: int, cuda: int, rel: int, processes: bool,
                 p: int, lvr: list, left: int, tot: int, dead: int, fills: list, nvg: dict,
                 window: int, top: int, start: int) -> tuple[int, int, int, int]:
        """``_take_bids`` on level ``p`` through its index of bids of gang <= v (v = GPUs
        the ask ``ask_id`` has left, < 8; the level's deque itself while 8 or more; gangs
        never change, so entries only die); when a fill leaves fewer GPUs, the walk moves
        on in the smaller index after the last seq seen.
        Only for an ask whose owner rests no bid. Returns (left, tot, gang bound, dead):
        the bound is exact down to v + 1 (the bids outside the index) when walked whole."""
        q = lvr[0]
        lv = lvr[3]
        if lv is None:
            lv = lvr[3] = {}
        ix = self._ix
        own = self._bid_own
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
                    d = lv[v] = deque(b for b in q if b[0] and b[5] <= v)
                    self._bid_gen += len(d)
                j = 0
                n = len(d)
            if j >= n:
                break
            b = d[j]
            bg = b[0]
            if not bg:
                if j:
                    j += 1
                else:
                    d.popleft()
                    n -= 1
                continue
            if b[3] <= last:  # seen before the move to this index
                j += 1
                continue
            last = b[3]
            gang = b[5]
            if (gang > left or b[6] > window or b[7] > cuda
                    or b[8] > rel or b[9] == node
                    or (processes and b[10]) or (b[11] and b[11] != node)):
                if gang < mn:
                    mn = gang
                j += 1
                continue
            k = left // gang
            kb = bg // gang
            if k > kb:
                k = kb
            if b[12]:
                nvg[b[2]] = gang
                k = self._nvlink_gangs(node, gang, k, fills, nvg, start)
                if not k:
                    if gang < mn:
                        mn = gang
                    j += 1
                    continue
            g = k * gang
            fills.append((b[2], ask_id, node, g, p))
            left -= g
            tot -= g
            if bg != g:
                bg -= g
                b[0] = bg
                if b[14] is not None:
                    b[14].gpus = bg
                if gang < mn:
                    mn = gang
                j += 1
                continue
            b[0] = 0
            del ix[b[2]]
            _dec(own, b[1])
            if d is not q:
                if q[0] is b:
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
