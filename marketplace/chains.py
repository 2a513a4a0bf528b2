"""A lease chain as its buyer sees it (API `chain`, the lease page): every lease of the
chain in order and one line per step, e.g. "lease 41 failed on node A (GPU 3: XID 79,
GPU has fallen off the bus) at 12:03:10; continued as lease 42 on node B at 12:03:14"."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from marketplace.faults import gpu_of
from marketplace.models import Lease, Order
from providers.models import Gpu

_XID = re.compile(r"XID (?P<code>\d+) [A-Z0-9_]+ \((?P<what>[^)]*)\)")


def _clock(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S") if at else "?"


def short_cause(lease: Lease) -> str:
    """The failure in a few words: "GPU 3: XID 79, GPU has fallen off the bus" (the GPU's
    index on its node by PCI bus id), else the stored cause."""
    uuid = gpu_of(lease.cause)
    if not uuid:
        return lease.cause
    bus_ids = list(Gpu.objects.filter(node_id=lease.node_id, parent__isnull=True)
                   .order_by("pci_bus_id").values_list("uuid", flat=True))
    where = f"GPU {bus_ids.index(uuid)}" if uuid in bus_ids else f"GPU {uuid}"
    rest = lease.cause.split(": ", 2)[-1]
    xid = _XID.search(rest)
    what = f"XID {xid['code']}, {xid['what']}" if xid else rest
    return f"{where}: {what}"


def _resting(failed: Lease) -> str:
    """"bid N, resting at $X/GPU-hour" (its status when no longer open)."""
    from marketplace.failover import resting_words  # failover imports this module

    order = Order.objects.filter(continues_lease_id=failed.pk).order_by("pk").first()
    if order is None:
        return "a resting bid"
    words = resting_words(order.pk, order.price)
    return words if order.status in Order.ACTIVE else f"{words} ({order.status})"


def chain_of(lease: Lease) -> list[Lease]:
    """The chain's leases, first first."""
    root = lease.chain
    return list(Lease.objects.filter(pk=root).select_related("node")) + list(
        Lease.objects.filter(chain_id=root).exclude(pk=root).select_related("node")
        .order_by("pk"))


def story(leases: list[Lease]) -> list[str]:
    """One line per lease of the chain that failed, saying what became of it."""
    by_continues = {x.continues_id: x for x in leases if x.continues_id}
    lines = []
    for x in leases:
        if x.status != "failed":
            continue
        line = f"lease {x.pk} failed on node {x.node.name} ({short_cause(x)}) at " \
               f"{_clock(x.ended_at)}"
        nxt = by_continues.get(x.pk)
        if nxt is not None:
            line += f"; continued as lease {nxt.pk} on node {nxt.node.name} at " \
                    f"{_clock(nxt.created_at)}"
            if nxt.started_at:
                line += f", running at {_clock(nxt.started_at)}"
        elif x.failover_state == "rested":
            line += "; no ask at or below its price: continues as " + _resting(x)
        elif x.failover_state == "released":
            told = (x.events.filter(detail__failover="released").order_by("-pk")
                    .values_list("cause", flat=True).first())
            line += "; " + (told or "not continued: the unused hold was released")
        elif x.failover_state == "pending":
            line += "; being continued"
        lines.append(line)
    return lines


def chain_body(lease: Lease) -> dict | None:
    """The API's `chain`: null for a lease alone in its chain, else {"id", "leases":
    [{"id", "node", "status", "failure_code", "fault"}], "story": [lines]}."""
    leases = chain_of(lease)
    if len(leases) < 2 and lease.status != "failed":
        return None
    return {"id": lease.chain,
            "leases": [{"id": x.pk, "node": x.node_id, "status": x.status,
                        "fault": x.fault, "failure_code": x.failure_code} for x in leases],
            "story": story(leases)}
