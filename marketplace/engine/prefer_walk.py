"""The walk of an incoming bid that prefers some nodes (``Bid.prefer``: the nodes whose
runner holds the bid's image, docs/IMAGES.md). ``PreferWalks`` is a mixin of
``OrderBook``: every attribute it reads is a slot there.

The rule (docs/MATCHING.md, "Bids that prefer a cached image"): price levels are walked
best price first exactly as ``Walks._take_asks`` walks them, and the bid never takes a
worse price while a better one can fill it. Only inside one price level, among asks at
that same price, the asks of preferred nodes come first (in time order), then the level's
other asks (in time order). Every other rule is the plain walk's: gangs, windows, CUDA,
reliability, the avoided node, image-only, one node, NVLink, self-trade prevention.

It walks each level's deque directly (no gang index), so it costs what the plain walk
costs without the index, twice over a level it does not finish in the first pass. Only
bids with a non-empty ``prefer`` come here; the plain walk is untouched.
"""

from __future__ import annotations

from .walks import _COMPACT_MIN, _dec


class PreferWalks:
    __slots__ = ()

    def _take_preferring(self, c: list, now: int, fills: list, stc: list,
                         prefer: frozenset[int]) -> int:
        """Walk asks for the bid cell ``c`` (``prefer`` non-empty: node ids); return the
        GPUs left unfilled. Mutates the book as ``_take_asks`` does (cells and fill tuples
        as in walks.py). Level bounds (a level's ``[2]``, ``_ask_lo``) stay upper/lower bounds:
        this walk only takes GPUs away."""
        px = self._ask_px
        lvs = self._ask_lv
        ix = self._ix
        own = self._ask_own
        left, owner, bid_id, _, limit, gang, dur, need, mrel, avoid, image, only, nv = c[:13]
        mine = owner in own
        end = now + dur
        start = len(fills)
        dead = 0
        i = 0
        while i < len(px) and left:
            p = px[i]
            if p > limit:
                break
            lv = lvs[p]
            if lv[2] < gang and not mine:  # no ask of this level holds a whole gang
                i += 1
                continue
            q = lv[0]
            tot = lv[1]
            for first in (True, False):  # the preferred nodes' asks, then the others
                for a in q:
                    ag = a[0]
                    if not ag or (a[5] in prefer) is not first:
                        continue
                    if a[1] == owner:  # self-trade prevention: the resting ask goes
                        a[0] = 0
                        del ix[a[2]]
                        _dec(own, owner)
                        tot -= ag
                        stc.append(a[2])
                        dead += 1
                        continue
                    if (ag < gang or end > a[6] or (need and a[7] < need)
                            or (mrel and a[8] < mrel) or (avoid and a[5] == avoid)
                            or (image and not a[9]) or (only and a[5] != only)):
                        continue  # (the plain walk's conditions)
                    k = min(ag // gang, left // gang)
                    if nv:
                        k = self._nvlink_gangs(a[5], gang, k, fills, {bid_id: gang}, start)
                        if not k:
                            continue
                    g = k * gang
                    fills.append((bid_id, a[2], a[5], g, p))
                    left -= g
                    tot -= g
                    if ag != g:
                        a[0] = ag - g
                        if a[10] is not None:
                            a[10].gpus = ag - g
                    else:
                        a[0] = 0
                        del ix[a[2]]
                        _dec(own, a[1])
                        dead += 1
                    if not left:
                        break
                if not left:
                    break
            if tot:
                lv[1] = tot
                i += 1
            else:
                del px[i]
                del lvs[p]
        if dead:
            self._ask_dead += dead
            if self._ask_dead > _COMPACT_MIN + 2 * len(ix):
                self._compact(lvs)
                self._ask_dead = 0
        return left
