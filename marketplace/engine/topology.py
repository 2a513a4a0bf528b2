"""NVLink topology of one node's GPUs: which GPUs a lease takes, how many NVLink-connected
gangs a node can give, and how a node's interconnect is worded. Plain Python, no Django.

A GPU is named by a string (the market uses its UUID), listed in PCI bus-id order; `peers`
maps each to the GPUs it reaches over NVLink (`mutual` keeps the pairs both report). A gang
is NVLink-connected when every pair of its GPUs are peers (a clique). Rules:
docs/MATCHING.md, "Interconnect".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

#: Search steps allowed per question; 8 GPUs per node (the usual HGX board) need at most
#: a few hundred, so the search is exact there. Past the budget the answer is "cannot".
SEARCH_BUDGET = 20_000

TIMES = "\u00d7"  # the multiplication sign of "8 × H100"
FULL_MESH, PAIRS, PARTIAL, PCIE_ONLY = ("NVLink full mesh", "NVLink pairs",
                                        "NVLink, partly connected", "PCIe only")


def pick_gangs(free: Sequence[str], peers: Mapping[str, frozenset[str]], gang: int,
               count: int) -> list[str] | None:
    """`count` disjoint NVLink-connected gangs of `gang` GPUs among `free` (bus-id order),
    the earliest GPUs first; the GPUs taken, gang after gang, or None when the node
    cannot give them (or the search passes SEARCH_BUDGET). A gang of 1 needs no link."""
    if count <= 0:
        return []
    if gang < 1 or gang * count > len(free):
        return None
    if gang == 1:
        return list(free[:count])
    steps = [0]

    def cliques(clique: list[str], options: list[str]):
        """Every clique of `gang` extending `clique` with `options`, earliest first."""
        if len(clique) == gang:
            yield clique
            return
        for n, g in enumerate(options):
            steps[0] += 1
            if steps[0] > SEARCH_BUDGET or len(options) - n < gang - len(clique):
                return
            yield from cliques([*clique, g], [o for o in options[n + 1:]
                                              if o in peers.get(g, ())])

    def pack(rest: list[str], wanted: int) -> list[str] | None:
        if wanted == 0:
            return []
        for n, first in enumerate(rest):  # `first` in a gang, or left out
            if len(rest) - n < gang * wanted:
                return None
            later = rest[n + 1:]
            for clique in cliques([first], [g for g in later if g in peers.get(first, ())]):
                found = pack([g for g in later if g not in clique], wanted - 1)
                if found is not None:
                    return [*clique, *found]
                if steps[0] > SEARCH_BUDGET:
                    return None
        return None

    return pack(list(free), count)


def max_gangs(free: Sequence[str], peers: Mapping[str, frozenset[str]], gang: int,
              limit: int) -> int:
    """How many disjoint NVLink-connected gangs of `gang` GPUs `free` holds, at most
    `limit`."""
    for count in range(min(limit, len(free) // max(gang, 1)), 0, -1):
        if pick_gangs(free, peers, gang, count) is not None:
            return count
    return 0


def take(free: list[str], peers: Mapping[str, frozenset[str]], gpus: int,
         nvlink_gang: int) -> list[str] | None:
    """The GPUs a lease of `gpus` GPUs takes from `free` (bus-id order), removed from it:
    whole NVLink-connected gangs of `nvlink_gang` (0: no requirement, the first `gpus`).
    None (nothing removed) when the node cannot give them. Lease creation and the
    engine's question "how many gangs are left" (after a pass's earlier fills) use this
    one rule, so they agree."""
    if nvlink_gang:
        chosen = pick_gangs(free, peers, nvlink_gang, gpus // nvlink_gang)
    else:
        chosen = list(free[:gpus]) if gpus <= len(free) else None
    if chosen is not None:
        gone = set(chosen)
        free[:] = [g for g in free if g not in gone]
    return chosen


def mutual(links: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """Peers by bus id, keeping only pairs both GPUs report (an NVLink goes both ways; a
    one-sided report is not trusted)."""
    return {g: frozenset(p for p in ps if p != g and g in links.get(p, ()))
            for g, ps in links.items()}


def describe(peers: Mapping[str, frozenset[str]]) -> str:
    """A node's interconnect in words: FULL_MESH (every pair linked), PAIRS (the GPUs
    linked two by two), PARTIAL (some links), PCIE_ONLY (none; also a lone GPU)."""
    gpus = sorted(peers)
    if len(gpus) < 2 or not any(peers.values()):
        return PCIE_ONLY
    if all(b in peers[a] for a, b in combinations(gpus, 2)):
        return FULL_MESH
    if all(len(peers[g]) == 1 and g in peers[next(iter(peers[g]))] for g in gpus):
        return PAIRS
    return PARTIAL
