"""The ledger in the admin: read-only, always (append-only journal)."""

from django.contrib import admin

from settlement.models import (
    Account,
    ChainAddress,
    ChainDeposit,
    ChainSettlement,
    ConnectedAccount,
    Hold,
    JournalEntry,
    Payout,
    Posting,
    StripeEvent,
    TopUp,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PostingInline(admin.TabularInline):
    model = Posting
    extra = 0
    can_delete = False
    readonly_fields = ["account", "amount"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "owner", "balance", "allow_negative"]
    list_filter = ["kind"]


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "reference", "memo", "created_at"]
    list_filter = ["kind"]
    inlines = [PostingInline]


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = ["id", "buyer", "status", "original", "amount", "captured", "released",
                    "reference"]
    list_filter = ["status"]


@admin.register(TopUp)
class TopUpAdmin(ReadOnlyAdmin):
    list_display = ["id", "buyer", "amount_cents", "status", "credited", "payment_intent_id",
                    "created_at"]
    list_filter = ["status"]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "outcome", "received_at"]
    list_filter = ["type"]


@admin.register(ConnectedAccount)
class ConnectedAccountAdmin(ReadOnlyAdmin):
    list_display = ["user", "stripe_account_id", "created_at"]


@admin.register(Payout)
class PayoutAdmin(ReadOnlyAdmin):
    list_display = ["id", "provider", "amount_cents", "status", "transfer_id", "failure",
                    "created_at"]
    list_filter = ["status"]


@admin.register(ChainAddress)
class ChainAddressAdmin(ReadOnlyAdmin):
    list_display = ["user", "address", "created_at"]


@admin.register(ChainDeposit)
class ChainDepositAdmin(ReadOnlyAdmin):
    list_display = ["tx_hash", "log_index", "buyer", "amount", "block_number"]


@admin.register(ChainSettlement)
class ChainSettlementAdmin(ReadOnlyAdmin):
    list_display = ["lease_key", "entry", "cost", "provider_amount", "platform_fee", "tx_hash"]
