"""NVLink topology (engine.topology) and NVLink bids in the engine's OrderBook."""

from __future__ import annotations

from marketplace.engine import Ask, Bid, OrderBook
from marketplace.engine import topology as t

GPUS = [f"00000000:{n:02X}:00.0" for n in range(8)]
MESH = {g: frozenset(x for x in GPUS if x != g) for g in GPUS}
PAIRS = {g: frozenset([GPUS[n ^ 1]]) for n, g in enumerate(GPUS)}
NONE = {g: frozenset() for g in GPUS}
NOW = 1_700_000_000


def test_gangs_are_cliques_and_the_words_name_the_shape():
    assert t.pick_gangs(GPUS, MESH, 4, 2) == GPUS
    assert t.pick_gangs(GPUS, PAIRS, 4, 1) is None
    assert t.pick_gangs(GPUS, PAIRS, 2, 4) == GPUS
    assert t.max_gangs(GPUS, PAIRS, 2, 8) == 4
    assert t.max_gangs(GPUS[1:], PAIRS, 2, 8) == 3  # GPU 1 lost its partner
    assert t.max_gangs(GPUS, NONE, 2, 8) == 0
    # a square 0-1-2-3-0 without diagonals holds no triangle
    square = t.mutual({GPUS[0]: [GPUS[1], GPUS[3]], GPUS[1]: [GPUS[0], GPUS[2]],
                       GPUS[2]: [GPUS[1], GPUS[3]], GPUS[3]: [GPUS[2], GPUS[0]]})
    assert t.max_gangs(GPUS[:4], square, 3, 1) == 0
    assert t.max_gangs(GPUS[:4], square, 2, 2) == 2
    assert [t.describe(p) for p in (MESH, PAIRS, NONE, square, {GPUS[0]: frozenset()})] == [
        t.FULL_MESH, t.PAIRS, t.PCIE_ONLY, t.PARTIAL, t.PCIE_ONLY]


def test_one_sided_links_are_not_peers_and_take_removes_what_it_picks():
    assert t.mutual({"a": ["b", "c"], "b": ["a"], "c": []}) == {
        "a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset()}
    free = list(GPUS)
    assert t.take(free, PAIRS, 3, 0) == GPUS[:3]  # no requirement: bus-id order
    assert t.take(free, PAIRS, 2, 2) == GPUS[4:6]  # 3 lost its partner 2
    assert free == [GPUS[3], GPUS[6], GPUS[7]]
    assert t.take(free, PAIRS, 4, 2) is None and len(free) == 3


def _links(topologies: dict[int, dict]):
    def links(node, gang, taken):
        free, peers = list(GPUS), topologies[node]
        for gpus, nvgang in taken:
            t.take(free, peers, gpus, nvgang)
        return t.max_gangs(free, peers, gang, len(free))
    return links


def test_an_nvlink_bid_fills_only_where_a_connected_gang_is_free():
    book = OrderBook()
    book.links = _links({1: NONE, 2: MESH})
    book.submit_ask(Ask(1, 10, 1_000_000, 8, 1, NOW + 86_400, 1), NOW)  # cheaper, PCIe only
    book.submit_ask(Ask(2, 11, 2_000_000, 8, 2, NOW + 86_400, 2), NOW)
    result = book.submit_bid(Bid(3, 20, 3_000_000, 4, 4, 3600, 3, nvlink=True), NOW)
    assert [(f.ask_id, f.gpus) for f in result.fills] == [(2, 4)]
    plain = book.submit_bid(Bid(4, 21, 3_000_000, 4, 4, 3600, 4), NOW)
    assert [(f.ask_id, f.gpus) for f in plain.fills] == [(1, 4)]


def test_a_resting_nvlink_bid_waits_for_a_mesh_ask_and_counts_earlier_fills():
    book = OrderBook()
    book.links = _links({1: PAIRS, 2: PAIRS})
    book.submit_bid(Bid(1, 20, 3_000_000, 2, 2, 3600, 1, nvlink=True), NOW)
    book.submit_bid(Bid(2, 21, 3_000_000, 4, 2, 3600, 2, nvlink=True), NOW)
    # 3 GPUs offered: one pair for bid 1; bid 2 needs two pairs, gets none of the third GPU
    result = book.submit_ask(Ask(3, 10, 1_000_000, 3, 1, NOW + 86_400, 3), NOW)
    assert [(f.bid_id, f.gpus) for f in result.fills] == [(1, 2)]
    fok = Bid(4, 22, 3_000_000, 8, 4, 3600, 4, tif="FOK", nvlink=True)
    assert book.submit_bid(fok, NOW).killed  # pairs hold no gang of 4
    assert OrderBook().submit_bid(Bid(5, 1, 1, 2, 2, 60, 5, nvlink=True), NOW).rested


def _flow(seed: int, nvlink: bool, gangs: int = 10**6):
    """A seeded flow of asks and gang bids (some NVLink when `nvlink`): (the fills of each
    submit, the NVLink bids' ids); every node gives `gangs` NVLink-connected gangs (10**6:
    a boundless full mesh)."""
    import random
    rng = random.Random(seed)
    book = OrderBook()
    book.links = lambda node, gang, taken: gangs
    out, nvlink_ids = [], set()
    for n in range(1, 400):
        if rng.random() < 0.4:
            ask = Ask(n, 1000 + n, rng.randrange(10, 30), rng.choice((2, 4, 8)), n % 5,
                      NOW + 86_400, n)
            out.append(book.submit_ask(ask, NOW).fills)
        else:
            gang = rng.choice((2, 4))
            b = Bid(n, 2000 + n, rng.randrange(10, 30), gang * rng.choice((1, 2)), gang, 60,
                    n, tif=rng.choice(("GTC", "IOC", "FOK")),
                    nvlink=rng.random() < 0.5 and nvlink)
            if b.nvlink:
                nvlink_ids.add(b.id)
            out.append(book.submit_bid(b, NOW).fills)
    return out, nvlink_ids


def test_where_every_node_is_a_full_mesh_nvlink_bids_trade_as_plain_ones():
    for seed in range(5):
        assert _flow(seed, nvlink=True)[0] == _flow(seed, nvlink=False)[0]


def test_where_no_node_has_nvlink_nvlink_bids_never_trade():
    flow, nvlink_ids = _flow(1, nvlink=True, gangs=0)
    traded = {f.bid_id for fills in flow for f in fills}
    assert traded and nvlink_ids and not traded & nvlink_ids
    plain = {f.bid_id for fills in _flow(1, nvlink=False, gangs=0)[0] for f in fills}
    assert plain & nvlink_ids  # the same bids without the requirement do trade
