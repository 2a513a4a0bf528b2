"""NVLink topology of the nodes' GPUs as the market uses it: the free GPUs of a node with
their NVLink peers (from the runner's inventory, providers.Gpu.nvlink_peers), the engine's
question "how many NVLink-connected gangs can this node give" (`links_for`), which GPUs a
lease takes (`pick`), and a node's interconnect in words (`node_summary`). The rules:
docs/MATCHING.md, "Interconnect"; the search: engine/topology.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from django.utils import timezone

from marketplace.engine import topology
from marketplace.models import GpuClass, Order
from providers.models import Gpu, MaintenanceWindow
from providers.services import normal_bus_id


def gpu_order(uuid: str, bus_id: str) -> tuple[str, str]:
    """The order a lease takes a node's free GPUs in: bus id, then UUID (slices of one
    GPU share its bus id). Lease creation and the engine's replay both sort by it."""
    return normal_bus_id(bus_id), uuid


def _graph(rows: Iterable[tuple[str, str, list]]) -> tuple[list[str], dict[str, frozenset]]:
    """(GPU UUIDs in bus-id order, mutual NVLink peers by UUID) of (uuid, bus id, peers)."""
    rows = sorted(rows, key=lambda r: gpu_order(r[0], r[1]))
    by_bus: dict[str, list[str]] = {}
    for uuid, bus, _peers in rows:
        by_bus.setdefault(normal_bus_id(bus), []).append(uuid)
    links = {uuid: [u for b in peers or [] for u in by_bus.get(b, [])]
             for uuid, _bus, peers in rows}
    return [r[0] for r in rows], topology.mutual(links)


def free_gpus(node_id: int, market_id: int) -> tuple[list[str], dict[str, frozenset]]:
    """The node's healthy GPUs of the class in no active lease (UUIDs, bus-id order) and
    the NVLink peers among ALL its GPUs of the class (a peer in a lease is still linked)."""
    mine = Gpu.objects.filter(node_id=node_id, gpu_class_id=market_id)
    rows = list(mine.values_list("uuid", "pci_bus_id", "nvlink_peers", "healthy"))
    busy = set(mine.filter(lease_gpus__active=True).values_list("uuid", flat=True))
    order, peers = _graph(r[:3] for r in rows)
    usable = {r[0] for r in rows if r[3] and r[0] not in busy}
    return [u for u in order if u in usable], peers


def links_for(market_id: int) -> Callable[[int, int, list[tuple[int, int]]], int]:
    """The engine's OrderBook.links for one market: NVLink-connected gangs of `gang` GPUs
    node `node` can give after `taken` (the pass's earlier fills, as lease creation will
    take them: topology.take in fill order). Reads the database when asked (only NVLink
    bids ask)."""
    def links(node: int, gang: int, taken: list[tuple[int, int]]) -> int:
        free, peers = free_gpus(node, market_id)
        for gpus, nvlink_gang in taken:
            if topology.take(free, peers, gpus, nvlink_gang) is None:
                return 0
        return topology.max_gangs(free, peers, gang, len(free) // gang)
    return links


def pick(node_id: int, market_id: int, count: int, nvlink_gang: int = 0) -> list[str] | None:
    """UUIDs of the `count` GPUs a lease takes on the node (topology.take: bus-id order, or
    whole NVLink-connected gangs of `nvlink_gang`); None when the node cannot give them."""
    free, peers = free_gpus(node_id, market_id)
    return topology.take(free, peers, count, nvlink_gang)


def can_connect(node_id: int, market_id: int, gpus: int) -> bool:
    """Whether the node's healthy GPUs of the class (leased or not) hold `gpus` GPUs all
    NVLink-connected (a sealed bid's check when it is placed)."""
    rows = Gpu.objects.filter(node_id=node_id, gpu_class_id=market_id, healthy=True)
    order, peers = _graph(rows.values_list("uuid", "pci_bus_id", "nvlink_peers"))
    return topology.pick_gangs(order, peers, gpus, 1) is not None


PEERS_UNKNOWN = "NVLink, peers unknown"


def interconnect_words(gpus: list[Gpu]) -> str:
    """topology.describe of one node's GPUs; PEERS_UNKNOWN when links are up but no
    peer is known (a recorded host with `nvidia-smi nvlink -s` only); "" for a lone GPU."""
    if len(gpus) < 2:
        return ""
    peers = _graph((g.uuid, g.pci_bus_id, g.nvlink_peers) for g in gpus)[1]
    words = topology.describe(peers)
    if words == topology.PCIE_ONLY and any(g.nvlink_links_active for g in gpus):
        return PEERS_UNKNOWN
    return words


def describe_gpus(gpus: Iterable[Gpu]) -> str:
    """"8 × H100 SXM 80GB, NVLink full mesh" for one node's GPUs (interconnect_words; the
    class's name, or the product name; several classes each counted)."""
    gpus = list(gpus)
    counts = Counter(getattr(g.gpu_class, "name", "") or g.product_name for g in gpus)
    what = ", ".join(f"{n} {topology.TIMES} {name}" for name, n in counts.items())
    words = interconnect_words(gpus)
    return f"{what}, {words}" if words else what


def node_summary(node_id: int, market_id: int) -> str:
    """describe_gpus of the node's GPUs of one class."""
    return describe_gpus(Gpu.objects.filter(node_id=node_id, gpu_class_id=market_id)
                         .select_related("gpu_class"))


def offers(market: GpuClass, limit: int = 50) -> list[dict]:
    """The market's standing asks, cheapest first, each with its node described, and never
    who offers it: [{"price": micro-USD per GPU-hour, "gpus": still offered, "node_gpus":
    the node's GPUs of the class, "interconnect": "NVLink full mesh" (topology.describe),
    "summary": "8 × H100 SXM 80GB, NVLink full mesh", "reliability": the node's 30-day
    reliability, "0.950", or None without a record (docs/FAULTS.md), "maintenance": the
    node's windows not yet over, [{"starts_at", "ends_at"}] by start (the ask sells no time
    past the first one's start: marketplace/maintenance.py)}]."""
    asks = list(Order.objects.filter(market=market, side=Order.Side.ASK,
                                     status__in=Order.ACTIVE, remaining_gpus__gt=0)
                .order_by("price", "pk").values_list("price", "remaining_gpus", "node_id",
                                                     "node__reliability")[:limit])
    by_node: dict[int, list[Gpu]] = {}
    for gpu in (Gpu.objects.filter(node_id__in={a[2] for a in asks}, gpu_class=market)
                .select_related("gpu_class")):
        by_node.setdefault(gpu.node_id, []).append(gpu)
    windows: dict[int, list[dict]] = {}
    for node, starts_at, ends_at in (
            MaintenanceWindow.objects.filter(node_id__in={a[2] for a in asks},
                                             ends_at__gt=timezone.now())
            .order_by("starts_at").values_list("node_id", "starts_at", "ends_at")):
        windows.setdefault(node, []).append({"starts_at": starts_at, "ends_at": ends_at})
    out = []
    for price, gpus, node, reliability in asks:
        mine = by_node.get(node, [])
        out.append({"price": price, "gpus": gpus, "node_gpus": len(mine),
                    "interconnect": interconnect_words(mine), "summary": describe_gpus(mine),
                    "reliability": None if reliability is None else str(reliability),
                    "maintenance": windows.get(node, [])})
    return out
