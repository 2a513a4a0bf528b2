"""Money Stripe takes back from a top-up: refunds and disputes (verified webhooks only).

Stripe docs ("Refunds", "Disputes"): `charge.refunded` carries the charge's cumulative
`amount_refunded` in cents; `charge.dispute.created` and `charge.dispute.funds_withdrawn`
withdraw a dispute's `amount`; `charge.dispute.funds_reinstated` gives it back when we
win. Stripe may deliver these more than once, together, and in any order.

Each event is applied under a lock on the top-up's row (one per PaymentIntent,
SELECT … FOR UPDATE, taken before any ledger account), as the difference between what
Stripe's figure says the ledger should hold and what it holds:
- refunds: the ledger's refunds of the PaymentIntent (journal entries referencing
  `payment_intent:<id>`) are brought up to Stripe's cumulative figure; a figure at or
  below what is held changes nothing (25 then 10 debits 25, once). `TopUp.refunded_cents`
  keeps the figure applied, which `checks.stripe_reversals_match_stripe` compares with
  the ledger;
- disputes: one withdrawal and at most one reinstatement per dispute id (journal
  idempotency keys); a reinstatement that arrives before its withdrawal records both, so
  the late withdrawal changes nothing and the buyer never holds the amount twice.

A refund or dispute proves the payment succeeded: a top-up not credited yet is credited
first (as `payment_intent.succeeded` would, once per PaymentIntent). What the buyer
already spent becomes debt (a negative `buyer_debt` account, repaid first from the next
credit), so no other balance goes below zero.
"""

from __future__ import annotations

import logging

import stripe
from django.db.models import Sum

from settlement.models import Account, JournalEntry, Posting, TopUp
from settlement.services import account, post_entry
from settlement.stripe_payments import WebhookRefused, cents_to_micros, credit_topup

log = logging.getLogger("gpumarket.stripe")

WITHDRAWN = {"charge.dispute.created", "charge.dispute.funds_withdrawn"}
REINSTATED = "charge.dispute.funds_reinstated"
EVENT_TYPES = frozenset({"charge.refunded", REINSTATED} | WITHDRAWN)


def reference(payment_intent_id: str) -> str:
    """The journal reference of a PaymentIntent's refunds and disputes."""
    return f"payment_intent:{payment_intent_id}"


def _lock_topup(payment_intent_id: str) -> TopUp | None:
    """The top-up of `payment_intent_id`, locked until the caller's transaction ends."""
    return TopUp.objects.select_for_update().filter(payment_intent_id=payment_intent_id).first()


def _id_of(value) -> str | None:
    """An object's id, whether Stripe sent it as a string or expanded."""
    if isinstance(value, str):
        return value
    return getattr(value, "id", None) if value is not None else None


def _cents(obj, field: str) -> int:
    value = getattr(obj, field, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WebhookRefused(f"{obj.get('object', 'object')} {obj.get('id')}: {field} "
                             "is not a whole number of cents")
    return value


def apply(event: stripe.Event) -> str:
    """Apply a refund or dispute event (type in EVENT_TYPES) in the caller's transaction;
    returns what happened. Raises WebhookRefused for an event without valid amounts."""
    obj = event.data.object
    pi = _id_of(getattr(obj, "payment_intent", None))
    topup = _lock_topup(pi) if pi else None
    if topup is None:
        return f"ignored {event.type}: {obj.id} is not for a gpumarket top-up"
    if event.type == "charge.refunded":
        captured = getattr(obj, "amount_captured", None)
        _ensure_credited(topup, _cents(obj, "amount") if captured is None
                         else _cents(obj, "amount_captured"))
        return _refund(event.type, topup, obj, _cents(obj, "amount_refunded"))
    _ensure_credited(topup, topup.amount_cents)
    return _dispute(event.type, topup, obj, cents_to_micros(_cents(obj, "amount")))


def _ensure_credited(topup: TopUp, cents: int) -> None:
    if topup.status != TopUp.Status.SUCCEEDED:
        credit_topup(topup, cents)


def _taken_back(payment_intent_id: str, kinds: list[str]) -> int:
    """micro-USD the ledger has sent back to Stripe for a PaymentIntent in entries of
    `kinds` (a reinstatement counts negative)."""
    return Posting.objects.filter(
        entry__kind__in=kinds, entry__reference=reference(payment_intent_id),
        account__kind=Account.Kind.EXTERNAL_STRIPE,
    ).aggregate(t=Sum("amount"))["t"] or 0


def _room(topup: TopUp) -> int:
    """What refunds and disputes may still take back: the credit less what they took."""
    return topup.credited - _taken_back(topup.payment_intent_id, [
        JournalEntry.Kind.STRIPE_REFUND, JournalEntry.Kind.STRIPE_DISPUTE,
        JournalEntry.Kind.STRIPE_DISPUTE_REINSTATED])


def _refused(event_type: str, topup: TopUp, what: str, amount: int) -> str:
    log.error("stripe %s for %s: %s of %d micro-USD exceeds what is left of the %d "
              "credited; nothing applied", event_type, topup.payment_intent_id, what, amount,
              topup.credited)
    return (f"refused {event_type} for {topup.payment_intent_id}: {what} of {amount} "
            f"micro-USD exceeds what is left of the {topup.credited} credited")


def _refund(event_type: str, topup: TopUp, charge, cumulative_cents: int) -> str:
    pi = topup.payment_intent_id
    held = _taken_back(pi, [JournalEntry.Kind.STRIPE_REFUND])
    target = cents_to_micros(cumulative_cents)
    if target <= held:
        return (f"{event_type} for {pi} already applied: the ledger holds {held} micro-USD "
                f"refunded, Stripe's figure is {target}")
    if target - held > _room(topup):
        return _refused(event_type, topup, "a refund", target - held)
    _take(topup, target - held, kind=JournalEntry.Kind.STRIPE_REFUND,
          memo=f"{event_type} {charge.id} (refunded in all: {cumulative_cents} cents)",
          key=f"stripe-refund:{pi}:{cumulative_cents}")
    topup.refunded_cents = cumulative_cents
    topup.save(update_fields=["refunded_cents"])
    return f"{event_type}: debited {target - held} micro-USD, user {topup.buyer_id}"


def _dispute(event_type: str, topup: TopUp, dispute, amount: int) -> str:
    withdraw_key = f"stripe-dispute:{dispute.id}"
    won_key = f"stripe-dispute-won:{dispute.id}"
    done = set(JournalEntry.objects.filter(idempotency_key__in=[withdraw_key, won_key])
               .values_list("idempotency_key", flat=True))
    memo = f"{event_type} {dispute.id}"
    if event_type in WITHDRAWN:
        if withdraw_key in done:
            return f"{event_type} {dispute.id} already applied"
        if amount > _room(topup):
            return _refused(event_type, topup, "a dispute", amount)
        _take(topup, amount, kind=JournalEntry.Kind.STRIPE_DISPUTE, memo=memo,
              key=withdraw_key)
        return f"{event_type}: debited {amount} micro-USD, user {topup.buyer_id}"
    if won_key in done:
        return f"{event_type} {dispute.id} already applied"
    if withdraw_key not in done:  # the withdrawal's event is late: record it now
        _take(topup, amount, kind=JournalEntry.Kind.STRIPE_DISPUTE,
              memo=f"{memo} (withdrawal recorded with its reinstatement)", key=withdraw_key)
    _give(topup, amount, memo=memo, key=won_key)
    return f"{event_type}: credited {amount} micro-USD, user {topup.buyer_id}"


def _accounts(buyer_id: int) -> tuple[Account, Account, Account]:
    """(Stripe, the buyer's wallet, the buyer's debt), locked in primary-key order."""
    stripe_acct = account(Account.Kind.EXTERNAL_STRIPE)
    wallet = account(Account.Kind.BUYER_AVAILABLE, buyer_id)
    debt, _ = Account.objects.get_or_create(kind=Account.Kind.BUYER_DEBT, owner_id=buyer_id,
                                            defaults={"allow_negative": True})
    locked = {a.pk: a for a in Account.objects.select_for_update()
              .filter(pk__in=[stripe_acct.pk, wallet.pk, debt.pk]).order_by("pk")}
    return locked[stripe_acct.pk], locked[wallet.pk], locked[debt.pk]


def _take(topup: TopUp, amount: int, *, kind: str, memo: str, key: str) -> None:
    """Debit `amount` micro-USD to Stripe: from the wallet, the rest as debt."""
    stripe_acct, wallet, debt = _accounts(topup.buyer_id)
    from_wallet = min(amount, max(wallet.balance, 0))
    post_entry(kind=kind, postings=[(stripe_acct, amount), (wallet, -from_wallet),
                                    (debt, -(amount - from_wallet))],
               memo=memo, reference=reference(topup.payment_intent_id), idempotency_key=key)


def _give(topup: TopUp, amount: int, *, memo: str, key: str) -> None:
    """Credit `amount` micro-USD back from Stripe: the debt is repaid first."""
    stripe_acct, wallet, debt = _accounts(topup.buyer_id)
    owed = min(amount, max(-debt.balance, 0))
    post_entry(kind=JournalEntry.Kind.STRIPE_DISPUTE_REINSTATED,
               postings=[(stripe_acct, -amount), (debt, owed), (wallet, amount - owed)],
               memo=memo, reference=reference(topup.payment_intent_id), idempotency_key=key)
