"""The order book's matching walks and price levels (the hot loops of
``marketplace.engine.book.OrderBook``; its module docstring has the rules and the
structure). ``Walks`` is a mixin: every attribute it reads is an ``OrderBook`` slot.

A resting order is a "cell", a plain list (built and read faster than an object; the
walks index it with literal ints, so the layout below is fixed):

* both sides: ``[0] gpus`` left (0: dead, cancelled or filled), ``[1] owner``, ``[2] id``,
  ``[3] seq``, ``[4] price``;
* ask: ``[5] node``, ``[6] available_until``, ``[7] cuda``, ``[8] rel``, ``[9] runs_images``,
  ``[10]`` the ``Ask`` it mirrors (None until ``asks()`` makes one);
* bid: ``[5] gang``, ``[6] duration_s``, ``[7] min_cuda``, ``[8] min_rel``, ``[9] avoid_node``,
  ``[10] image_only``, ``[11] node`` (only), ``[12] nvlink``, ``[13] tif``, ``[14]`` the
  ``Bid`` it mirrors (None until ``bids()`` makes one). A partial fill of a resting order
  sets its mirror's ``gpus`` too.

A price level is one record, a plain list, per side's dict ``_ask_lv`` / ``_bid_lv``
(price → record; the sorted prices are ``_ask_px`` / ``_bid_px``):

* ask level: ``[0]`` deque of cells in seq order, ``[1]`` total GPUs resting there,
  ``[2]`` an upper bound of its asks' GPUs, ``[3]`` its gang index (``{v: deque}``,
  gang_walks.py) or None;
* bid level: ``[0]``, ``[1]`` as above, ``[2]`` a lower bound of its bids' gangs,
  ``[3]`` its gang index or None, ``[4]`` an upper bound of its bids' gangs.

Fills are plain tuples ``(bid_id, ask_id, node, gpus, price)`` (``Fill``'s fields).
Units: prices integer micro-USD per GPU-hour, GPUs counts, times epoch seconds.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

_COMPACT_MIN = 1024
_BIG = 1 << 62
_GE_TOP = 8  # the gang indexes (gang_walks.py) have buckets for v in 2.._GE_TOP


def _rest(px: list[int], lvs: dict, cell: list, price: int, seq: int, gpus: int,
          new: list) -> list:
    """Put ``cell`` at its seq position in the level ``price``; a missing level is made
    from ``new`` (its fields after ``[0]`` the deque and ``[1]`` the total). Returns the
    level record; its gang index (``[3]``) is the caller's to keep or drop."""
    lv = lvs.get(price)
    if lv is None:
        insort(px, price)
        lv = lvs[price] = [deque((cell,)), gpus, *new]
        return lv
    lv[1] += gpus
    q = lv[0]
    while q and not q[-1][0]:  # dead cells at the tail: drop them, no scan
        q.pop()
    if q and q[-1][3] > seq:
        _insert(q, cell, seq)
    else:
        q.append(cell)
    return lv


def _insert(q: deque, cell: list, seq: int) -> bool:
    """Put ``cell`` before the live cells of a larger seq (rare: a re-matched or reloaded
    order keeps its priority). Returns True (the cell is not at the tail)."""
    j = len(q)
    while j:
        o = q[j - 1]
        if o[0] and o[3] < seq:
            break
        j -= 1
    q.insert(j, cell)
    return True


def _drop_level(px: list[int], lvs: dict, price: int) -> None:
    del px[bisect_left(px, price)]
    del lvs[price]


def _dec(own: dict, owner: int) -> None:
    n = own[owner] - 1
    if n:
        own[owner] = n
    else:
        del own[owner]


class Walks:
    """Matching walks over one book's price levels (mixed into ``OrderBook``; the
    gang walks through the level indexes are ``gang_walks.GangWalks``)."""

    __slots__ = ()

    def _take_asks(self, c: list, now: int, fills: list, stc: list) -> int:
        """Walk asks for the incoming bid cell ``c``; return the GPUs left unfilled.
        Appends fill tuples to ``fills`` and self-trade cancels to ``stc``; mutates the
        book (not ``c``)."""
        px = self._ask_px
        lvs = self._ask_lv
        ix = self._ix
        left, owner, bid_id, _, limit, gang, dur, need, mrel, avoid, image, only, nv = c[:13]
        end = now + dur
        own = self._ask_own
        mine = owner in own
        start = len(fills)
        use = gang >= self._gmin and not mine
        lop = -1  # the first price this walk saw that may hold >= v GPUs (-1: none yet)
        stop = _BIG  # the first price this walk did not look at
        dead = 0
        if use:  # start at the first level that may hold v GPUs (_ask_lo)
            v = gang if gang < _GE_TOP else _GE_TOP
            lo = self._ask_lo
            i = bisect_left(px, lo[v])
        else:
            v = _BIG
            i = 0
        while i < len(px):
            p = px[i]
            if p > limit:
                stop = p
                break
            lv = lvs[p]
            cap = lv[2]
            if cap < gang and not mine:  # no ask of this level holds a whole gang
                if lop < 0 and cap >= v:
                    lop = p
                i += 1
                continue
            q = lv[0]
            tot = lv[1]
            mx = 0
            if use:
                left, tot, mx, dead = self._take_ge(bid_id, gang, v, need, mrel, avoid,
                                                    image, only, nv, p, lv, left, tot,
                                                    dead, fills, end, start)
                n = 0  # the level was walked through its index
            else:
                n = len(q)
            j = 0
            while j < n:
                a = q[j]
                ag = a[0]
                if not ag:
                    if j:
                        j += 1
                    else:
                        q.popleft()
                        n -= 1
                    continue
                if a[1] == owner:
                    a[0] = 0
                    del ix[a[2]]
                    _dec(own, owner)
                    tot -= ag
                    stc.append(a[2])
                elif (ag < gang or end > a[6] or (need and a[7] < need)
                      or (mrel and a[8] < mrel) or (avoid and a[5] == avoid)
                      or (image and not a[9]) or (only and a[5] != only)):
                    if ag > mx:
                        mx = ag
                    j += 1
                    continue
                else:
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
                # the cell at j is now dead
                if j:
                    j += 1
                    dead += 1
                else:
                    q.popleft()
                    n -= 1
                if not left:
                    break
            if tot:
                lv[1] = tot
                if left:  # walked the whole level: its bound is now exact
                    lv[2] = mx
                if lop < 0 and (mx >= v or not left):
                    lop = p
                i += 1
            else:
                del px[i]
                del lvs[p]
            if not left:
                if i < len(px):
                    stop = px[i]
                break
        if use:  # every level below `new` holds fewer than v GPUs per ask
            new = lop if lop >= 0 else stop
            if new > lo[v]:
                for w in range(v, _GE_TOP + 1):
                    if lo[w] < new:
                        lo[w] = new
        if dead:
            self._ask_dead += dead
            if self._ask_dead > _COMPACT_MIN + 2 * len(ix):
                self._compact(lvs)
                self._ask_dead = 0
        return left

    def _take_bids(self, c: list, now: int, fills: list, stc: list) -> int:
        """Walk bids for the incoming ask cell ``c``; return the GPUs left. Mutates the
        book (not ``c``)."""
        px = self._bid_px
        lvs = self._bid_lv
        ix = self._ix
        left, owner, ask_id, _, limit, node, until, cuda, rel, images = c[:10]
        window = until - now
        processes = not images
        start = len(fills)
        nvg: dict[int, int] = {}  # NVLink bids filled in this pass → their gang
        own = self._bid_own
        mine = owner in own
        bix = self._gmin <= _GE_TOP
        dead = 0
        i = len(px) - 1
        while i >= 0:
            p = px[i]
            if p < limit:
                break
            lv = lvs[p]
            if left < lv[2] and not mine:  # every bid of this level wants a bigger gang
                i -= 1
                continue
            q = lv[0]
            tot = lv[1]
            mn = _BIG
            j = 0
            top = lv[4]
            if top > 1 and bix and not mine:  # some bid here has a gang > 1
                left, tot, mn, dead = self._take_gb(ask_id, node, cuda, rel, processes, p,
                                                    lv, left, tot, dead, fills, nvg, window,
                                                    top, start)
                n = 0  # the level was walked through its index
            else:
                n = len(q)
            while j < n:
                b = q[j]
                bg = b[0]
                if not bg:
                    if j:
                        j += 1
                    else:
                        q.popleft()
                        n -= 1
                    continue
                if b[1] == owner:
                    b[0] = 0
                    del ix[b[2]]
                    _dec(own, owner)
                    tot -= bg
                    stc.append(b[2])
                else:
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
                        j += 1
                        if not left:
                            break
                        if gang < mn:
                            mn = gang
                        continue
                    b[0] = 0
                    del ix[b[2]]
                    _dec(own, b[1])
                if j:
                    j += 1
                    dead += 1
                else:
                    q.popleft()
                    n -= 1
                if not left:
                    break
            if tot:
                lv[1] = tot
                if left:  # walked the whole level: its bound is now exact
                    lv[2] = mn
            else:
                del px[i]
                del lvs[p]
            i -= 1
            if not left:
                break
        if dead:
            self._bid_dead += dead
            if self._bid_dead > _COMPACT_MIN + 2 * len(ix):
                self._compact(lvs)
                self._bid_dead = 0
        return left

    def _bid_fillable(self, c: list, now: int) -> int:
        """GPUs the bid cell ``c`` would fill now (same walk as ``_take_asks``, no
        mutation)."""
        want, owner, bid_id, _, limit, gang, dur, need, mrel, avoid, image, only, nv = c[:13]
        end = now + dur
        got = 0
        seen: list[tuple] = []
        lvs = self._ask_lv
        for p in self._ask_px:
            if p > limit:
                break
            for a in lvs[p][0]:
                ag = a[0]
                if (not ag or a[1] == owner or ag < gang
                        or end > a[6] or (need and a[7] < need)
                        or a[8] < mrel or a[5] == avoid
                        or (image and not a[9]) or (only and a[5] != only)):
                    continue
                k = ag // gang
                if nv:  # as _take_asks would: after this walk's earlier gangs
                    k = self._nvlink_gangs(a[5], gang, k, seen, {bid_id: gang}, 0)
                    seen.append((bid_id, a[2], a[5], k * gang, p))
                got += k * gang
                if got >= want:
                    return want
        return got

    def _nvlink_gangs(self, node: int, gang: int, k: int, fills: list,
                      nvg: dict[int, int], start: int) -> int:
        """At most `k`: the NVLink-connected gangs `node` can still give (``links``), after
        this pass's earlier fills on it (``fills[start:]``; an NVLink bid's by its gang in
        `nvg`)."""
        if self.links is None:
            return 0
        taken = [(f[3], nvg.get(f[0], 0)) for f in fills[start:] if f[2] == node]
        return min(k, self.links(node, gang, taken))

    @staticmethod
    def _compact(lvs: dict) -> None:
        """Drop every dead cell of one side's levels (amortised: runs when dead > 1024 +
        2 x live; the gang indexes drop theirs lazily)."""
        for lv in lvs.values():
            lv[0] = deque(c for c in lv[0] if c[0])
