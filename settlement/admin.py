"""The ledger in the admin: read-only, always (append-only journal).

Amounts that would reveal a sealed bid (settlement.sealed) show "sealed": a sealed hold's
figures, its journal entries' postings and memo, and a buyer's wallet balances while one
of its sealed holds is active.
"""

from django.contrib import admin
from django.db.models import Exists, OuterRef, Q

from core.admin import ReadOnlyAdmin, StrictTabularInline
from settlement import sealed
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

BUYER_WALLET_KINDS = [Account.Kind.BUYER_AVAILABLE, Account.Kind.BUYER_HELD]


class PostingInline(StrictTabularInline):
    model = Posting
    fields = ["account", "amount"]
    readonly_fields = ["account"]
    secret_fields = ("amount",)

    def sealed_q(self):
        return sealed.sealed_holds_q("entry__hold")


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    """A buyer's wallet balances are sealed while one of its sealed holds is active (the
    drop of `available` and the rise of `held` are the hold)."""

    list_display = ["id", "kind", "owner", "balance", "allow_negative"]
    list_filter = ["kind"]
    secret_fields = ("balance",)

    def sealed_q(self):
        active = Hold.objects.filter(sealed.sealed_holds_q(), buyer=OuterRef("owner"),
                                     status=Hold.Status.ACTIVE)
        return Q(kind__in=BUYER_WALLET_KINDS) & Q(Exists(active))


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "reference", "memo", "created_at"]
    list_filter = ["kind"]
    inlines = [PostingInline]
    secret_fields = ("memo",)

    def sealed_q(self):
        return sealed.sealed_holds_q("hold")


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = ["id", "buyer", "status", "original", "amount", "captured", "released",
                    "reference"]
    list_filter = ["status"]
    secret_fields = ("original", "amount", "captured", "captured_fee", "released")

    def sealed_q(self):
        return sealed.sealed_holds_q()


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
