"""Sealed-bid auctions: the auction, its events, its sealed bids and the audit of a
superuser's reveal (docs/MATCHING.md). Re-exported from marketplace.models. Prices are
integer micro-USD per GPU-hour; durations whole seconds; times aware UTC."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from marketplace.choices import Interconnect
from marketplace.states import StateEvent, StateMachine


class Auction(StateMachine):
    """A provider's sealed-bid auction of one node's GPUs for a fixed duration."""

    class Rule(models.TextChoices):
        SECOND_PRICE = "second_price"
        UNIFORM_PRICE = "uniform_price"
        FIRST_PRICE = "first_price"

    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"
        CANCELLED = "cancelled"

    TRANSITIONS = {"open": {"closed", "cancelled"}}

    market = models.ForeignKey("marketplace.GpuClass", on_delete=models.PROTECT,
                               related_name="auctions")
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                 related_name="auctions")
    node = models.ForeignKey("providers.Node", on_delete=models.PROTECT, related_name="auctions")
    gpus = models.PositiveIntegerField()
    reserve_price = models.BigIntegerField(help_text="micro-USD per GPU-hour")
    rule = models.CharField(max_length=16, choices=Rule.choices, default=Rule.SECOND_PRICE)
    duration_seconds = models.PositiveIntegerField()
    opens_at = models.DateTimeField()
    closes_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    clearing_price = models.BigIntegerField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"auction #{self.pk} {self.gpus}× {self.market_id} ({self.rule})"


class AuctionEvent(StateEvent):
    auction = models.ForeignKey(Auction, on_delete=models.CASCADE, related_name="events")


class SealedBid(StateMachine):
    """A sealed bid: visible only to its bidder until the auction closes. Its moves go
    through the transition table; it has no events table (the auction's records it)."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        WITHDRAWN = "withdrawn"
        WON = "won"
        LOST = "lost"

    TRANSITIONS = {"active": {"withdrawn", "won", "lost"}}
    EVENT_RELATED_NAME = None

    auction = models.ForeignKey(Auction, on_delete=models.PROTECT, related_name="bids")
    bidder = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                               related_name="sealed_bids")
    price = models.BigIntegerField(help_text="micro-USD per GPU-hour")
    gpus = models.PositiveIntegerField()
    min_gpus = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    awarded_gpus = models.PositiveIntegerField(default=0)
    paid_price = models.BigIntegerField(null=True, blank=True)
    image = models.CharField(max_length=255, blank=True)
    command = models.JSONField(null=True, blank=True)
    ports = models.JSONField(default=list, blank=True,
                             help_text="container ports the lease exposes (as Order.ports)")
    # Templates and compatibility (marketplace/env_templates.py; issue 12's contract)
    template = models.CharField(max_length=64, blank=True, default="",
                                help_text="template id; empty: own image")
    min_cuda = models.CharField(max_length=16, blank=True, default="",
                                help_text='lowest node CUDA version, "12.4"; empty: none')
    port_roles = models.JSONField(default=dict, blank=True, help_text="as Order.port_roles")
    ssh = models.BooleanField(default=False, help_text="as Order.ssh")
    env = models.JSONField(default=dict, blank=True, help_text="as Order.env")
    notice_signal = models.CharField(
        max_length=8, blank=True, default="",
        help_text="as Order.notice_signal")
    stop_grace_seconds = models.PositiveSmallIntegerField(
        default=10, help_text="as Order.stop_grace_seconds")
    secrets_sealed = models.TextField(blank=True, default="",
                                      help_text="as Order.secrets_sealed: sealed with the bid")
    checkpoint = models.JSONField(default=dict, blank=True, help_text="as Order.checkpoint")
    checkpoint_sealed = models.TextField(blank=True, default="",
                                         help_text="as Order.checkpoint_sealed")
    interconnect = models.CharField(max_length=8, choices=Interconnect.choices,
                                    default=Interconnect.ANY,
                                    help_text="nvlink: the GPUs won all NVLink-connected")
    failover = models.BooleanField(default=True, help_text="as Order.failover")
    min_reliability = models.DecimalField(max_digits=4, decimal_places=3, null=True,
                                          blank=True, help_text="as Order.min_reliability")
    hold_id = models.BigIntegerField(help_text="settlement.Hold id")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["auction", "bidder"],
                                    condition=Q(status="active"),
                                    name="one_active_sealed_bid_per_bidder"),
        ]

    def __str__(self) -> str:
        return f"sealed bid #{self.pk} on auction {self.auction_id}"


class SealedBidAudit(models.Model):
    """A superuser's look at a sealed bid's figures after its auction ended, through the
    admin's reveal view: who, when, which bid of which auction, and why. Append-only."""

    viewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                               related_name="sealed_bid_audits")
    bid = models.ForeignKey(SealedBid, on_delete=models.PROTECT, related_name="audits")
    auction = models.ForeignKey(Auction, on_delete=models.PROTECT, related_name="bid_audits")
    reason = models.CharField(max_length=200)
    viewed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"user {self.viewer_id} revealed sealed bid #{self.bid_id} at {self.viewed_at}"
