"""Operators' admin for the market. Sealed bids' prices and quantities are hidden
until their auction closes."""

from django.contrib import admin

from marketplace.models import (
    ApiToken,
    Auction,
    AuctionEvent,
    Fill,
    GpuClass,
    Lease,
    LeaseEvent,
    LeaseGpu,
    Order,
    OrderEvent,
    SealedBid,
)
from settlement.admin import ReadOnlyAdmin


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OrderEventInline(ReadOnlyInline):
    model = OrderEvent


class AuctionEventInline(ReadOnlyInline):
    model = AuctionEvent


class LeaseEventInline(ReadOnlyInline):
    model = LeaseEvent


class LeaseGpuInline(ReadOnlyInline):
    model = LeaseGpu


@admin.register(GpuClass)
class GpuClassAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "memory_gb", "memory_bandwidth_gbps", "bf16_dense_tflops",
                    "reference_price"]


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    """Read-only: orders change only through the market's services, under the order
    book's lock (an edit here would bypass matching, holds and the book cache)."""

    list_display = ["id", "side", "market", "owner", "status", "price", "gpus", "remaining_gpus",
                    "created_at"]
    list_filter = ["side", "status", "market"]
    inlines = [OrderEventInline]


@admin.register(Fill)
class FillAdmin(admin.ModelAdmin):
    list_display = ["id", "market", "bid", "ask", "gpus", "price", "created_at"]


@admin.register(Auction)
class AuctionAdmin(admin.ModelAdmin):
    list_display = ["id", "market", "node", "gpus", "rule", "reserve_price", "status",
                    "closes_at", "clearing_price"]
    list_filter = ["status", "rule"]
    inlines = [AuctionEventInline]


@admin.register(SealedBid)
class SealedBidAdmin(admin.ModelAdmin):
    list_display = ["id", "auction", "bidder", "status", "shown_price", "shown_gpus"]
    exclude = ["price", "gpus", "min_gpus"]
    readonly_fields = ["shown_price", "shown_gpus"]

    @admin.display(description="price")
    def shown_price(self, bid):
        return bid.price if bid.auction.status != "open" else "sealed until close"

    @admin.display(description="GPUs")
    def shown_gpus(self, bid):
        return bid.gpus if bid.auction.status != "open" else "sealed until close"


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["id", "market", "node", "buyer", "status", "gpu_count", "price", "cost",
                    "started_at", "ended_at"]
    list_filter = ["status", "market"]
    inlines = [LeaseGpuInline, LeaseEventInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
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
