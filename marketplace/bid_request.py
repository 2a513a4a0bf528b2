"""A bid as every way in builds it (BidRequest) and what placing an order answers
(Placed): book.py's place_bid/place_bids take the one and return the other; book.py
re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from marketplace.checkpoints import Checkpoint
from marketplace.models import Lease, Order
from marketplace.ports import with_ssh


@dataclass(frozen=True)
class BidRequest:
    """One bid, the one shape every way in builds (the API's OrderInSerializer.bid_request,
    place_bid's keywords) and place_bids takes.

    price: micro-USD per GPU-hour; gpus: GPUs wanted; duration_seconds: lease length;
    gang_size: GPUs per node (None: all on one node); time_in_force: GTC, IOC or FOK;
    image/command: the container; expires_at: when a resting bid expires (None: never);
    client_order_id: the buyer's own id, unique per buyer (see _replay); interruptible:
    its leases may be preempted by a higher bid; ports: container TCP ports its leases
    expose (ports.clean_ports); template, min_cuda: as env_templates.resolve returns them
    (the API resolves a template into these terms; a min_cuda fills only against asks on
    nodes whose CUDA version meets it); port_roles: {"8888": "jupyter"}
    (ports.clean_port_roles); ssh: its leases get the buyer's SSH keys, port 22 (role ssh)
    added (ports.with_ssh); env / secrets: {NAME: value} for the workload (workload_env;
    secrets in clear here, sealed when written: never in a log or an answer);
    notice_signal, stop_grace_seconds: its leases' stop terms (lease_notice.py).
    checkpoint: the bid's store (checkpoints.Checkpoint, probed by the API; None: none),
    its credentials sealed when written (`checkpoint_sealed`), never in a repr; node: the
    one node it fills on (a node of the offers; None: any).
    """

    buyer_id: int
    market_slug: str
    price: int
    gpus: int
    duration_seconds: int
    gang_size: int | None = None
    time_in_force: str = "GTC"
    image: str = ""
    command: list[str] | None = None
    expires_at: datetime | None = None
    client_order_id: str | None = None
    interruptible: bool = False
    ports: list[int] | None = None
    template: str = ""
    min_cuda: str = ""
    port_roles: dict[str, str] | None = None
    ssh: bool = False
    env: dict[str, str] | None = None
    secrets: dict[str, str] | None = field(default=None, repr=False)
    interconnect: str = "any"
    checkpoint: Checkpoint | None = field(default=None, repr=False)
    failover: bool | None = None  # None: true unless interruptible (docs/FAULTS.md)
    min_reliability: Decimal | None = None
    avoid_node_id: int | None = None  # failover's resting bid: never on the failed node
    node: int | None = None  # fill only on this node (offers.check_bid_node)
    notice_signal: str = ""
    stop_grace_seconds: int = 10
    prefer_cached_image: bool = False  # same-price asks of nodes holding the image first

    def terms(self) -> dict[str, Any]:
        """The bid's order, by Order attribute (`market` by slug; not its owner, id or
        what is left): what _write_bids writes and a replay must repeat (_replay), in
        the order a replay compares them. Ports sorted, as clean_ports returns them.
        Not the secrets: they are sealed apart (`sealed_secrets`), and a replay compares
        them opened."""
        ports, roles = with_ssh(self.ports, self.port_roles, self.ssh)
        return {"side": Order.Side.BID, "market": self.market_slug, "price": self.price,
                "gpus": self.gpus, "duration_seconds": self.duration_seconds,
                "gang_size": self.gpus if self.gang_size is None else self.gang_size,
                "time_in_force": self.time_in_force, "image": self.image,
                "command": self.command, "expires_at": self.expires_at,
                "interruptible": bool(self.interruptible), "ports": ports,
                "template": self.template, "min_cuda": self.min_cuda,
                "port_roles": roles, "ssh": bool(self.ssh), "env": dict(self.env or {}),
                "interconnect": self.interconnect,
                "checkpoint": dict(self.checkpoint.terms) if self.checkpoint else {},
                "failover": (not self.interruptible) if self.failover is None
                else bool(self.failover),
                "min_reliability": self.min_reliability, "avoid_node_id": self.avoid_node_id,
                "node_id": self.node, "notice_signal": self.notice_signal,
                "stop_grace_seconds": self.stop_grace_seconds,
                "prefer_cached_image": bool(self.prefer_cached_image)}


@dataclass(frozen=True)
class Placed:
    """The order placed and the leases its matching made. `created` is False when a
    `client_order_id` was already used: `order` is then the first order with that id and
    `leases` every lease made from its fills so far."""

    order: Order
    leases: list[Lease]
    created: bool = True
