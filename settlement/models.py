"""The ledger: accounts, append-only journal entries of postings, and holds.

Amounts are integer micro-USD (1 USD = 1,000,000). Every journal entry's
postings sum to zero (checked when it is written, and by `ledger_check`).
An account's `balance` is a cache of the sum of its postings, written in the
same transaction as the postings; a database CHECK keeps every account that is
not external at or above zero.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Account(models.Model):
    class Kind(models.TextChoices):
        BUYER_AVAILABLE = "buyer_available", "buyer: available"
        BUYER_HELD = "buyer_held", "buyer: held in escrow"
        PROVIDER_EARNED = "provider_earned", "provider: earned, not paid out"
        PROVIDER_PAYOUT_PENDING = "provider_payout_pending", "provider: payout in flight"
        PLATFORM_REVENUE = "platform_revenue", "platform: revenue (take rate)"
        BUYER_DEBT = "buyer_debt", "buyer: owes (refund or dispute beyond the balance)"
        EXTERNAL_DEV_CREDIT = "external_dev_credit", "external: development credit"
        EXTERNAL_STRIPE = "external_stripe", "external: Stripe"
        EXTERNAL_CHAIN = "external_chain", "external: chain"

    EXTERNAL_KINDS = frozenset(
        {Kind.EXTERNAL_DEV_CREDIT, Kind.EXTERNAL_STRIPE, Kind.EXTERNAL_CHAIN}
    )
    # may go below zero: external accounts, and what a buyer owes after a refund or a
    # dispute took back money it had already spent (a receivable, negative by design)
    NEGATIVE_KINDS = EXTERNAL_KINDS | {Kind.BUYER_DEBT}

    kind = models.CharField(max_length=32, choices=Kind.choices)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        related_name="ledger_accounts",
    )
    allow_negative = models.BooleanField(default=False)
    balance = models.BigIntegerField(default=0, help_text="micro-USD; cache of the postings' sum")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "owner"], name="account_unique_kind_owner"),
            models.UniqueConstraint(fields=["kind"], condition=Q(owner__isnull=True),
                                    name="account_unique_kind_without_owner"),
            models.CheckConstraint(
                condition=Q(allow_negative=True) | Q(balance__gte=0),
                name="account_not_below_zero_unless_external",
            ),
        ]

    def __str__(self) -> str:
        who = f" of user {self.owner_id}" if self.owner_id else ""
        return f"{self.get_kind_display()}{who}"


class JournalEntry(models.Model):
    class Kind(models.TextChoices):
        DEV_CREDIT = "dev_credit", "development credit"
        HOLD_PLACE = "hold_place", "hold placed"
        HOLD_RELEASE = "hold_release", "hold released"
        HOLD_REDUCE = "hold_reduce", "hold reduced"
        LEASE_SETTLE = "lease_settle", "lease settled"
        LEASE_METER = "lease_meter", "lease metered (periodic settlement)"
        STRIPE_TOPUP = "stripe_topup", "Stripe top-up"
        CHAIN_DEPOSIT = "chain_deposit", "on-chain escrow deposit"
        STRIPE_REFUND = "stripe_refund", "Stripe refund"
        STRIPE_DISPUTE = "stripe_dispute", "Stripe dispute (funds withdrawn)"
        STRIPE_DISPUTE_REINSTATED = "stripe_dispute_reinstated", "Stripe dispute won"
        PAYOUT_RESERVE = "payout_reserve", "payout reserved"
        PAYOUT_SENT = "payout_sent", "payout sent"
        PAYOUT_REVERSED = "payout_reversed", "payout failed, reversed"
        FAULT_CREDIT = "fault_credit", "fault credit (provider to buyer)"

    kind = models.CharField(max_length=32, choices=Kind.choices)
    memo = models.CharField(max_length=200, blank=True)
    hold = models.ForeignKey("Hold", null=True, blank=True, on_delete=models.PROTECT,
                             related_name="entries")
    reference = models.CharField(max_length=64, blank=True,
                                 help_text="what caused it, e.g. 'lease:12'")
    idempotency_key = models.CharField(max_length=100, null=True, blank=True, unique=True)
    evidence = models.TextField(
        blank=True, default="",
        help_text="fault credit: the finding that made the provider pay (docs/FAULTS.md)")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name_plural = "journal entries"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} {self.reference}"


class Posting(models.Model):
    entry = models.ForeignKey(JournalEntry, on_delete=models.PROTECT, related_name="postings")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="postings")
    amount = models.BigIntegerField(help_text="micro-USD; + credits the account, − debits it")

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"posting #{self.pk} on account {self.account_id}"


class Hold(models.Model):
    """An escrow reservation of a buyer's money: active → captured | released.

    `amount` is what is still held; `captured` what was paid out of it;
    `released` what went back to the buyer. amount + captured + released is
    the original amount, always.
    """

    class Status(models.TextChoices):
        ACTIVE = "active"
        CAPTURED = "captured"
        RELEASED = "released"

    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="holds")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    original = models.BigIntegerField(help_text="micro-USD placed")
    amount = models.BigIntegerField(help_text="micro-USD still held")
    captured = models.BigIntegerField(default=0, help_text="micro-USD paid out of the hold")
    captured_fee = models.BigIntegerField(
        default=0, help_text="micro-USD of `captured` that went to the platform")
    released = models.BigIntegerField(default=0)
    reference = models.CharField(max_length=64, help_text="what it secures, e.g. 'order:7'")
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="hold_amount_not_negative"),
            models.CheckConstraint(
                condition=Q(original=models.F("amount") + models.F("captured")
                            + models.F("released")),
                name="hold_amounts_add_up",
            ),
        ]

    def __str__(self) -> str:
        return f"hold #{self.pk} {self.status} ({self.reference})"


class TopUp(models.Model):
    """A buyer's wallet top-up through a Stripe PaymentIntent. The wallet is credited
    only by the verified `payment_intent.succeeded` webhook, never by this row."""

    class Status(models.TextChoices):
        CREATED = "created"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="topups")
    amount_cents = models.PositiveIntegerField()
    payment_intent_id = models.CharField(max_length=100, unique=True, null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATED)
    credited = models.BigIntegerField(default=0, help_text="micro-USD credited by the webhook")
    refunded_cents = models.PositiveIntegerField(
        default=0, help_text="Stripe's cumulative amount_refunded applied to the ledger "
        "(cents; the highest figure seen that the credit covers)")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"top-up #{self.pk} {self.amount_cents} cents ({self.status})"


class StripeEvent(models.Model):
    """Every verified Stripe webhook event, once: the unique event id makes a repeated
    delivery a no-op."""

    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    received_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"


class ConnectedAccount(models.Model):
    """A provider's Stripe Connect (Express) account, the destination of its payouts."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                related_name="stripe_connected_account")
    stripe_account_id = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.stripe_account_id


class Payout(models.Model):
    """A transfer of a provider's earnings in whole cents: pending → paid | failed.
    The sub-cent rest stays in the provider's earned balance."""

    class Status(models.TextChoices):
        PENDING = "pending"
        PAID = "paid"
        FAILED = "failed"

    provider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                 related_name="payouts")
    amount_cents = models.PositiveBigIntegerField()
    amount = models.BigIntegerField(help_text="micro-USD = amount_cents × 10,000")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    transfer_id = models.CharField(max_length=100, blank=True)
    failure = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"payout #{self.pk} {self.amount_cents} cents ({self.status})"

    @property
    def idempotency_key(self) -> str:
        """Our key for Stripe's Transfer create: one per payout, stable across retries."""
        return f"gpumarket-payout-{self.pk}"


class ChainAddress(models.Model):
    """A user's address on the settlement chain: where a buyer deposits from, where a
    provider's share is credited."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                related_name="chain_address")
    address = models.CharField(max_length=42, unique=True, help_text="0x… checksummed")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "chain addresses"

    def __str__(self) -> str:
        return self.address


class ChainDeposit(models.Model):
    """A `Deposited` event credited to the buyer's wallet, once (unique tx + log index)."""

    tx_hash = models.CharField(max_length=66)
    log_index = models.PositiveIntegerField()
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="chain_deposits")
    amount = models.BigIntegerField(help_text="micro-USD (= token base units)")
    block_number = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tx_hash", "log_index"],
                                               name="chain_deposit_once")]

    def __str__(self) -> str:
        return f"deposit {self.amount} in {self.tx_hash}:{self.log_index}"


class ChainSettlement(models.Model):
    """A ledger settlement entry (lease_settle or lease_meter) mirrored on chain, once."""

    entry = models.OneToOneField(JournalEntry, on_delete=models.PROTECT,
                                 related_name="chain_settlement")
    lease_key = models.CharField(max_length=66, unique=True, help_text="0x… bytes32 id")
    cost = models.BigIntegerField()
    provider_amount = models.BigIntegerField()
    platform_fee = models.BigIntegerField()
    tx_hash = models.CharField(max_length=66, blank=True,
                               help_text="empty when found settled after a crash")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.lease_key} {self.cost}"
