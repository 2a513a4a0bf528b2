"""Operators' admin for the market (core.admin: query strings whitelisted,
secret columns masked).

A sealed bid's price, quantities and workload show "sealed" for every staff user,
superusers included, until its auction closes, and for good unless it won. After the
auction ends a superuser may reveal one bid through its "reveal" page, which records who
looked, when, at which bid and why (SealedBidAudit, read-only here).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from core.admin import ReadOnlyAdmin, StrictAdmin, StrictTabularInline
from marketplace.models import (
    ApiToken,
    Auction,
    AuctionEvent,
    Fill,
    GpuClass,
    Lease,
    LeaseEvent,
    LeaseExtension,
    LeaseGpu,
    Order,
    OrderEvent,
    RematchDue,
    SealedBid,
    SealedBidAudit,
    SshKey,
)
from marketplace.sealing import sealed_names
from marketplace.selectors import sealed_bid_q
from settlement.models import Hold

# a bid's or lease's sealed secrets (marketplace/sealing.py): never on an admin page, not
# even as ciphertext
SEALED_COLUMNS = ["secrets_sealed", "checkpoint_sealed"]


class OrderEventInline(StrictTabularInline):
    model = OrderEvent


class AuctionEventInline(StrictTabularInline):
    model = AuctionEvent


class LeaseEventInline(StrictTabularInline):
    model = LeaseEvent


class LeaseGpuInline(StrictTabularInline):
    model = LeaseGpu


class LeaseExtensionInline(StrictTabularInline):
    """The buyer's extensions (marketplace/lease_control.py), each with its own hold."""

    model = LeaseExtension


@admin.register(GpuClass)
class GpuClassAdmin(StrictAdmin):
    list_display = ["slug", "name", "parent", "mig_profile", "memory_gb",
                    "memory_bandwidth_gbps", "bf16_dense_tflops", "reference_price"]
    list_filter = [("parent", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["slug", "name"]


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    """Read-only: orders change only through the market's services, under the order
    book's lock (an edit here would bypass matching, holds and the book cache)."""

    list_display = ["id", "side", "market", "owner", "status", "price", "gpus", "remaining_gpus",
                    "created_at"]
    list_filter = ["side", "status", "market"]
    exclude = SEALED_COLUMNS
    inlines = [OrderEventInline]


@admin.register(Fill)
class FillAdmin(ReadOnlyAdmin):
    """Read-only: a fill is written by matching, with its lease and holds, under the
    market's lock (one added or edited here would have no money behind it)."""

    list_display = ["id", "market", "bid", "ask", "gpus", "price", "created_at"]


@admin.register(RematchDue)
class RematchDueAdmin(ReadOnlyAdmin):
    """Read-only: asks waiting for their re-match after a batch of lease ends; one older
    than GPUMARKET_REMATCH_REPAIR_SECONDS is the repair sweep's (docs/MATCHING.md)."""

    list_display = ["ask", "market", "since"]


@admin.register(Auction)
class AuctionAdmin(ReadOnlyAdmin):
    """Read-only: an auction opens, takes bids and closes through marketplace.auctions
    only (an edit here would bypass its holds and its one close)."""

    list_display = ["id", "market", "node", "gpus", "rule", "reserve_price", "status",
                    "closes_at", "clearing_price"]
    list_filter = ["status", "rule"]
    inlines = [AuctionEventInline]


class RevealForm(forms.Form):
    reason = forms.CharField(max_length=200, strip=True,
                             help_text="why you need this bid's figures (recorded)")


@admin.register(SealedBid)
class SealedBidAdmin(ReadOnlyAdmin):
    """Read-only; the figures of a sealed bid (selectors.sealed_bid_q) show "sealed"."""

    list_display = ["id", "auction", "bidder", "status", "price", "gpus", "awarded_gpus",
                    "paid_price"]
    list_filter = ["status"]
    secret_fields = ("price", "gpus", "min_gpus", "image", "command", "ports", "template",
                     "min_cuda", "port_roles", "ssh", "env", "interconnect")
    exclude = SEALED_COLUMNS
    readonly_fields = ["reveal"]

    def sealed_q(self):
        return sealed_bid_q()

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("auction")

    @admin.display(description="audit")
    def reveal(self, bid):
        if bid.auction.status == Auction.Status.OPEN:
            return "sealed until the auction closes"
        if not getattr(bid, "_sealed", True):
            return "public: this bid won"
        url = reverse("admin:marketplace_sealedbid_reveal", args=[bid.pk])
        return format_html('<a href="{}">reveal this bid (superusers; recorded)</a>', url)

    def get_urls(self):
        view = self.admin_site.admin_view(self.reveal_view)
        return [path("<int:object_id>/reveal/", view, name="marketplace_sealedbid_reveal"),
                *super().get_urls()]

    def reveal_view(self, request, object_id: int):
        """GET: the form asking why; POST with a reason: one SealedBidAudit row, then the
        bid's figures and its hold's. Superusers only (403), after the auction ended
        (409), never before; a missing reason is a 400 naming it."""
        if not request.user.is_superuser:
            raise PermissionDenied
        bid = SealedBid.objects.select_related("auction").filter(pk=object_id).first()
        if bid is None:
            raise Http404(f"no sealed bid {object_id}")
        if bid.auction.status == Auction.Status.OPEN:
            return HttpResponse(f"auction {bid.auction_id} is open: its bids are sealed until "
                                "it closes, for everyone", status=409,
                                content_type="text/plain; charset=utf-8")
        form = RevealForm(request.POST if request.method == "POST" else None)
        revealed, status = None, 200
        if request.method == "POST":
            if form.is_valid():
                with transaction.atomic():
                    SealedBidAudit.objects.create(viewer=request.user, bid=bid,
                                                  auction_id=bid.auction_id,
                                                  reason=form.cleaned_data["reason"])
                revealed = _figures(bid)
            else:
                status = 400
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": f"Reveal {bid}", "bid": bid, "form": form, "revealed": revealed}
        return TemplateResponse(request, "admin/marketplace/sealedbid/reveal.html", context,
                                status=status)


def _figures(bid: SealedBid) -> list[tuple[str, object]]:
    """The sealed figures of a bid and of its hold, as (label, value) rows."""
    hold = Hold.objects.filter(pk=bid.hold_id).first()
    rows = [("price (micro-USD per GPU-hour)", bid.price), ("GPUs", bid.gpus),
            ("minimum GPUs", bid.min_gpus), ("image", bid.image or "-"),
            ("command", bid.command), ("ports", bid.ports),
            ("template", bid.template or "-"), ("min CUDA", bid.min_cuda or "-"),
            ("port roles", bid.port_roles), ("SSH", bid.ssh), ("env", bid.env),
            # the secrets stay sealed, even here: their names only
            ("secrets (names; values are never shown)", ", ".join(
                sealed_names(bid.secrets_sealed)) or "-")]
    if hold is not None:
        rows += [(f"hold #{hold.pk} {label} (micro-USD)", getattr(hold, name))
                 for label, name in (("original", "original"), ("still held", "amount"),
                                     ("captured", "captured"), ("released", "released"))]
    return rows


@admin.register(SealedBidAudit)
class SealedBidAuditAdmin(ReadOnlyAdmin):
    """Who revealed which sealed bid, when and why: read-only for everyone."""

    list_display = ["id", "viewed_at", "viewer", "auction", "bid", "reason"]
    list_filter = [("viewer", admin.RelatedOnlyFieldListFilter)]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    """Read-only: a lease's status, times and money change only through its services
    (marketplace.leases, lease_end), each with its journal entry; an edit here would
    part the lease from the ledger (ledger_check's provider_earnings_match_settled_leases)."""

    list_display = ["id", "market", "node", "buyer", "status", "gpu_count", "price", "cost",
                    "started_at", "ended_at", "fault", "failure_code", "chain_id"]
    list_filter = ["status", "market", "fault", "failure_code"]
    exclude = [*SEALED_COLUMNS, "jupyter_token_sealed"]
    inlines = [LeaseGpuInline, LeaseEventInline, LeaseExtensionInline]


@admin.register(ApiToken)
class ApiTokenAdmin(StrictAdmin):
    """Users' API tokens: who, which (prefix), when; never the token (only its hash is
    stored, and not shown). Deleting one revokes it at once; none is made here."""

    list_display = ["id", "user", "name", "prefix", "created_at", "last_used_at", "expires_at"]
    search_fields = ["user__username", "name", "prefix"]
    exclude = ["key_hash"]
    readonly_fields = ["user", "name", "prefix", "created_at", "last_used_at", "expires_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SshKey)
class SshKeyAdmin(StrictAdmin):
    """Buyers' SSH public keys: who, which (type, fingerprint), when. Added by their
    owners only (API, wallet page: marketplace/ssh_keys.py's checks); deleting one here
    (a compromised key) keeps it out of the owner's next leases."""

    list_display = ["id", "owner", "name", "key_type", "fingerprint", "created_at"]
    list_filter = ["key_type"]
    search_fields = ["owner__username", "name", "fingerprint"]
    readonly_fields = ["owner", "name", "key_type", "fingerprint", "public_key",
                       "created_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
