"""Ledger invariants, checked over the whole database (DESIGN.md, invariants 1 and 3).

Each check returns the first violation as a sentence, or None. `ledger_check` (the
management command) runs them all and exits non-zero on the first violation.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Q, Sum

from settlement.models import Account, Hold, JournalEntry, Posting, TopUp


def entries_balance() -> str | None:
    """Every journal entry's postings sum to zero."""
    bad = (JournalEntry.objects.annotate(total=Sum("postings__amount"))
           .exclude(total=0).exclude(total__isnull=True).first())
    if bad:
        return f"journal entry {bad.pk} ({bad.kind}) does not balance: sums to {bad.total}"
    return None


def balances_match_postings() -> str | None:
    """Each account's cached balance equals the sum of its postings."""
    sums = dict(Posting.objects.values("account").annotate(t=Sum("amount"))
                .values_list("account", "t"))
    for acct in Account.objects.all().order_by("pk"):
        if acct.balance != sums.get(acct.pk, 0):
            return (f"account {acct.pk} ({acct}) balance {acct.balance} differs from its "
                    f"postings' sum {sums.get(acct.pk, 0)}")
    return None


def no_negative_balances() -> str | None:
    """No account below zero unless it is external."""
    bad = Account.objects.filter(allow_negative=False, balance__lt=0).first()
    return f"account {bad.pk} ({bad}) is below zero: {bad.balance}" if bad else None


def holds_match_held_accounts() -> str | None:
    """Each buyer's held account equals the sum of that buyer's active holds."""
    held = dict(Account.objects.filter(kind=Account.Kind.BUYER_HELD)
                .values_list("owner_id", "balance"))
    active = dict(Hold.objects.filter(status=Hold.Status.ACTIVE).values("buyer")
                  .annotate(t=Sum("amount")).values_list("buyer", "t"))
    for buyer in sorted(set(held) | set(active)):
        if held.get(buyer, 0) != active.get(buyer, 0):
            return (f"user {buyer}: held account {held.get(buyer, 0)} differs from active "
                    f"holds {active.get(buyer, 0)}")
    return None


def stripe_reversals_match_stripe() -> str | None:
    """Per PaymentIntent, refunds equal Stripe's last cumulative figure, and refunds plus
    disputes never take back more than was credited."""
    prefix = "payment_intent:"
    kinds = [JournalEntry.Kind.STRIPE_REFUND, JournalEntry.Kind.STRIPE_DISPUTE,
             JournalEntry.Kind.STRIPE_DISPUTE_REINSTATED]
    rows = (Posting.objects.filter(account__kind=Account.Kind.EXTERNAL_STRIPE,
                                   entry__kind__in=kinds, entry__reference__startswith=prefix)
            .values_list("entry__reference", "entry__kind").annotate(t=Sum("amount")))
    refunded: dict[str, int] = {}
    taken: dict[str, int] = {}  # refunds + withdrawals − reinstatements, micro-USD
    for ref, kind, total in rows:
        pi = ref[len(prefix):]
        taken[pi] = taken.get(pi, 0) + total
        if kind == JournalEntry.Kind.STRIPE_REFUND:
            refunded[pi] = refunded.get(pi, 0) + total
    topups = {t.payment_intent_id: t for t in TopUp.objects.filter(
        Q(payment_intent_id__in=list(taken)) | Q(refunded_cents__gt=0))}
    for pi in sorted(set(taken) | set(topups)):
        topup = topups.get(pi)
        if topup is None:
            return f"payment intent {pi}: refunds or disputes in the ledger, but no top-up"
        figure = topup.refunded_cents * 10_000
        if refunded.get(pi, 0) != figure:
            return (f"payment intent {pi}: the ledger refunded {refunded.get(pi, 0)} "
                    f"micro-USD, Stripe's last cumulative figure is {figure}")
        back = taken.get(pi, 0)
        if back > topup.credited:
            return (f"payment intent {pi}: the ledger took back {back} micro-USD in refunds "
                    f"and disputes, more than the {topup.credited} credited")
        if back < 0:
            return f"payment intent {pi}: disputes gave back {-back} micro-USD more than taken"
    return None


LEDGER_CHECKS: tuple[Callable[[], str | None], ...] = (
    entries_balance, balances_match_postings, no_negative_balances, holds_match_held_accounts,
    stripe_reversals_match_stripe,
)
CHECKS: list[Callable[[], str | None]] = list(LEDGER_CHECKS)


def register(check: Callable[[], str | None]) -> Callable[[], str | None]:
    """Add a check from another app (the market registers the ones that need its models,
    so that settlement imports nothing of it). Usable as a decorator; idempotent."""
    if check not in CHECKS:
        CHECKS.append(check)
    return check


def first_violation(checks=None) -> str | None:
    """The first violation of `checks` (default: every registered check), or None.
    Ledger-only tests that move money without a market pass LEDGER_CHECKS."""
    for check in CHECKS if checks is None else checks:
        problem = check()
        if problem:
            return problem
    return None


def ledger_matches_chain() -> str | None:
    """With on-chain settlement on: every ledger charge between parties with chain
    addresses has its LeaseSettled event with equal amounts, and no event lacks one."""
    from settlement import onchain

    cfg = onchain.from_settings()
    if cfg is None:
        return None
    mismatches = onchain.reconcile(cfg)
    if mismatches:
        m = mismatches[0]
        return f"chain {m.kind} for lease id 0x{m.lease_id.hex()}: {m.detail}"
    return None


CHECKS.append(ledger_matches_chain)
