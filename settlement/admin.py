"""The ledger in the admin: read-only, always (append-only journal)."""

from django.contrib import admin

from settlement.models import Account, Hold, JournalEntry, Posting


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
