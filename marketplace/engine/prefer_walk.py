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

from .types import Bid, Fill
from .walks import _COMPACT_MIN, _dec


class PreferWalks:
    __slots__ = ()

    def _take_preferring(self, bid: Bid, now: int, fills: list, stc: list) -> int:
        """Walk asks for ``bid`` (``bid.prefer`` non-empty); return the GPUs left unfilled.
        Mutates the book as ``_take_asks`` does. Level bounds (``_ask_cap``, ``_ask_lo``)
        stay upper/lower bounds: this walk only takes GPUs away."""
        px = self._ask_px
        qs = self._ask_q
        tots = self._ask_tot
        ix = self._ask_ix
        caps = self._ask_cap
        own = self._ask_own
        owner = bid.owner
        gang = bid.gang
        prefer = bid.prefer
        mine = owner in own
        left = bid.gpus
        end = now + bid.duration_s
        dead = 0
        i = 0
        while i < len(px) and left:
            p = px[i]
            if p > bid.price:
                break
            if caps[p] < gang and not mine:  # no ask of this level holds a whole gang
                i += 1
                continue
            q = qs[p]
            tot = tots[p]
            for first in (True, False):  # the preferred nodes' asks, then the others
                for cell in q:
                    a = cell[0]
                    if a is None or (a.node in prefer) is not first:
                        continue
                    ag = a.gpus
                    if a.owner == owner:  # self-trade prevention: the resting ask goes
                        cell[0] = None
                        del ix[a.id]
                        _dec(own, owner)
                        tot -= ag
                        stc.append(a.id)
                        dead += 1
                        continue
                    if not self._serves(bid, a, end):
                        continue
                    k = min(ag // gang, left // gang)
                    if bid.nvlink:
                        k = self._nvlink_gangs(a.node, gang, k, fills, {bid.id: gang})
                        if not k:
                            continue
                    g = k * gang
                    fills.append(Fill(bid.id, a.id, a.node, g, p))
                    left -= g
                    tot -= g
                    if ag != g:
                        a.gpus = ag - g
                    else:
                        cell[0] = None
                        del ix[a.id]
                        _dec(own, a.owner)
                        dead += 1
                    if not left:
                        break
                if not left:
                    break
            if tot:
                tots[p] = tot
                i += 1
            else:
                del px[i]
                del qs[p]
                del tots[p]
                del caps[p]
                self._ask_ge.pop(p, None)
        if dead:
            self._ask_dead += dead
            if self._ask_dead > _COMPACT_MIN + 2 * len(ix):
                self._compact(self._ask_q)
                self._ask_dead = 0
        return left

    @staticmethod
    def _serves(bid: Bid, a, end: int) -> bool:
        """Whether ask ``a`` may fill ``bid`` at all (the plain walk's conditions)."""
        return not (a.gpus < bid.gang or end > a.available_until
                    or (bid.min_cuda and a.cuda < bid.min_cuda)
                    or (bid.min_rel and a.rel < bid.min_rel)
                    or (bid.avoid_node and a.node == bid.avoid_node)
                    or (bid.image_only and not a.runs_images)
                    or (bid.node and a.node != bid.node))
