"""The order book's matching walks and price levels (the hot loops of
``marketplace.engine.book.OrderBook``; its module docstring has the rules and the
structure). ``Walks`` is a mixin: every attribute it reads is an ``OrderBook`` slot.

Units: prices integer micro-USD per GPU-hour, GPUs counts, times epoch seconds.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

from .types import Ask, Bid, Fill

_COMPACT_MIN = 1024
_BIG = 1 << 62
_GE_TOP = 8  # the gang indexes (gang_walks.py) have buckets for v in 2.._GE_TOP


def _rest(px: list[int], qs: dict, tots: dict, cell: list, price: int, seq: int, gpus: int):
    """Put ``cell`` at its seq position in the level ``price`` (creating the level).

    Returns True when the cell went anywhere but the tail (an out-of-order seq)."""
    q = qs.get(price)
    if q is None:
        insort(px, price)
        qs[price] = deque((cell,))
        tots[price] = gpus
        return False
    tots[price] += gpus
    while q and q[-1][0] is None:  # dead cells at the tail: drop them, no scan
        q.pop()
    if q:
        last = q[-1][0]
        if last.seq > seq:
            # Rare: out-of-order seq (e.g. a re-matched order keeps its priority).
            j = len(q)
            while j:
                o = q[j - 1][0]
                if o is not None and o.seq < seq:
                    break
                j -= 1
            q.insert(j, cell)
            return True
    q.append(cell)
    return False


def _drop_level(px: list[int], qs: dict, tots: dict, price: int, bound: dict) -> None:
    del px[bisect_left(px, price)]
    del qs[price]
    del tots[price]
    bound.pop(price, None)


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

    def _take_asks(self, bid: Bid, now: int, fills: list, stc: list) -> int:
        """Walk asks for ``bid``; return the GPUs left unfilled. Mutates the book."""
        px = self._ask_px
        qs = self._ask_q
        tots = self._ask_tot
        ix = self._ask_ix
        limit = bid.price
        owner = bid.owner
        gang = bid.gang
        bid_id = bid.id
        end = now + bid.duration_s
        need = bid.min_cuda
        mrel = bid.min_rel
        avoid = bid.avoid_node
        image = bid.image_only
        left = bid.gpus
        nv = bid.nvlink
        only = bid.node
        caps = self._ask_cap
        own = self._ask_own
        mine = owner in own
        ges = self._ask_ge
        use = gang >= self._ge_min_gang and not mine
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
            if caps[p] < gang and not mine:  # no ask of this level holds a whole gang
                if lop < 0 and caps[p] >= v:
                    lop = p
                i += 1
                continue
            q = qs[p]
            tot = tots[p]
            mx = 0
            if use:
                left, tot, mx, dead = self._take_ge(bid, p, q, left, tot, dead, fills, end)
                n = 0  # the level was walked through its index
            else:
                n = len(q)
            j = 0
            while j < n:
                cell = q[j]
                a = cell[0]
                if a is None:
                    if j:
                        j += 1
                    else:
                        q.popleft()
                        n -= 1
                    continue
                ag = a.gpus
                if a.owner == owner:
                    cell[0] = None
                    del ix[a.id]
                    _dec(own, owner)
                    tot -= ag
                    stc.append(a.id)
                elif (ag < gang or end > a.available_until or (need and a.cuda < need)
                      or (mrel and a.rel < mrel) or (avoid and a.node == avoid)
                      or (image and not a.runs_images) or (only and a.node != only)):
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
                tots[p] = tot
                if left:  # walked the whole level: its bound is now exact
                    caps[p] = mx
                if lop < 0 and (mx >= v or not left):
                    lop = p
                i += 1
            else:
                del px[i]
                del qs[p]
                del tots[p]
                del caps[p]
                ges.pop(p, None)
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
                self._compact(self._ask_q)
                self._ask_dead = 0
        return left

    def _take_bids(self, ask: Ask, now: int, fills: list, stc: list) -> int:
        """Walk bids for ``ask``; return the GPUs left. Mutates the book."""
        px = self._bid_px
        qs = self._bid_q
        tots = self._bid_tot
        ix = self._bid_ix
        limit = ask.price
        owner = ask.owner
        ask_id = ask.id
        node = ask.node
        window = ask.available_until - now
        cuda = ask.cuda
        rel = ask.rel
        processes = not ask.runs_images
        left = ask.gpus
        nvg: dict[int, int] = {}  # NVLink bids filled in this pass → their gang
        mgs = self._bid_mingang
        own = self._bid_own
        mine = owner in own
        bix = self._ge_min_gang <= _GE_TOP
        mxg = self._bid_maxgang
        dead = 0
        i = len(px) - 1
        while i >= 0:
            p = px[i]
            if p < limit:
                break
            if left < mgs[p] and not mine:  # every bid of this level wants a bigger gang
                i -= 1
                continue
            q = qs[p]
            tot = tots[p]
            mn = _BIG
            j = 0
            top = mxg[p]
            if top > 1 and bix and not mine:  # some bid here has a gang > 1
                left, tot, mn, dead = self._take_gb(ask, p, q, left, tot, dead, fills, nvg,
                                                    window, top)
                n = 0  # the level was walked through its index
            else:
                n = len(q)
            while j < n:
                cell = q[j]
                b = cell[0]
                if b is None:
                    if j:
                        j += 1
                    else:
                        q.popleft()
                        n -= 1
                    continue
                bg = b.gpus
                if b.owner == owner:
                    cell[0] = None
                    del ix[b.id]
                    _dec(own, owner)
                    tot -= bg
                    stc.append(b.id)
                else:
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
                        j += 1
                        if not left:
                            break
                        if gang < mn:
                            mn = gang
                        continue
                    cell[0] = None
                    del ix[b.id]
                    _dec(own, b.owner)
                if j:
                    j += 1
                    dead += 1
                else:
                    q.popleft()
                    n -= 1
                if not left:
                    break
            if tot:
                tots[p] = tot
                if left:  # walked the whole level: its bound is now exact
                    mgs[p] = mn
            else:
                del px[i]
                del qs[p]
                del tots[p]
                del mgs[p]
                del mxg[p]
                self._bid_ge.pop(p, None)
            i -= 1
            if not left:
                break
        if dead:
            self._bid_dead += dead
            if self._bid_dead > _COMPACT_MIN + 2 * len(ix):
                self._compact(self._bid_q)
                self._bid_dead = 0
        return left

    def _bid_fillable(self, bid: Bid, now: int) -> int:
        """GPUs ``bid`` would fill now (same walk as ``_take_asks``, no mutation)."""
        gang = bid.gang
        want = bid.gpus
        owner = bid.owner
        end = now + bid.duration_s
        need = bid.min_cuda
        image = bid.image_only
        only = bid.node
        got = 0
        seen: list[Fill] = []
        qs = self._ask_q
        for p in self._ask_px:
            if p > bid.price:
                break
            for cell in qs[p]:
                a = cell[0]
                if (a is None or a.owner == owner or a.gpus < gang
                        or end > a.available_until or (need and a.cuda < need)
                        or a.rel < bid.min_rel or a.node == bid.avoid_node
                        or (image and not a.runs_images) or (only and a.node != only)):
                    continue
                k = a.gpus // gang
                if bid.nvlink:  # as _take_asks would: after this walk's earlier gangs
                    k = self._nvlink_gangs(a.node, gang, k, seen, {bid.id: gang})
                    seen.append(Fill(bid.id, a.id, a.node, k * gang, p))
                got += k * gang
                if got >= want:
                    return want
        return got

    def _nvlink_gangs(self, node: int, gang: int, k: int, fills: list,
                      nvg: dict[int, int]) -> int:
        """At most `k`: the NVLink-connected gangs `node` can still give (``links``), after
        this pass's earlier `fills` on it (an NVLink bid's by its gang in `nvg`)."""
        if self.links is None:
            return 0
        taken = [(f.gpus, nvg.get(f.bid_id, 0)) for f in fills if f.node == node]
        return min(k, self.links(node, gang, taken))

    def _maybe_compact(self) -> None:
        """Compact a side whose dead cells exceed 1024 + 2 x its live orders."""
        if self._bid_dead > _COMPACT_MIN + 2 * len(self._bid_ix):
            self._compact(self._bid_q)
            self._bid_dead = 0
        if self._ask_dead > _COMPACT_MIN + 2 * len(self._ask_ix):
            self._compact(self._ask_q)
            self._ask_dead = 0

    @staticmethod
    def _compact(qs: dict) -> None:
        """Drop every dead cell of one side (amortised: runs when dead > 1024 + 2 x live)."""
        for p, q in qs.items():
            qs[p] = deque(c for c in q if c[0] is not None)
