"""Fault credits: a provider pays a buyer for a lease its fault ended (docs/FAULTS.md).

Called by the marketplace with ids, amounts (integer micro-USD) and the evidence text;
imports nothing of `marketplace`.
"""

from __future__ import annotations

from django.db import transaction

from settlement.models import Account, JournalEntry
from settlement.money import format_usd
from settlement.services import _lock_accounts, account, post_entry, wallet_credit_postings

Kind = Account.Kind


def fault_credit(*, provider_id: int, buyer_id: int, amount: int, bound: int,
                 reference: str, evidence: str) -> int:
    """Move min(`amount`, `bound`, the provider's earned balance) micro-USD from the
    provider's earnings to the buyer's wallet (a buyer's debt is repaid first), one
    `fault_credit` journal entry with `evidence` attached; returns the micro-USD credited.
    `bound`: what the lease earned the provider. Exactly once per `reference`
    (idempotency key `fault_credit:<ref>`): a second call writes nothing and returns the
    first credit. 0 when the credit comes to 0 (nothing written). Raises ValueError for a
    negative amount or bound."""
    if amount < 0 or bound < 0:
        raise ValueError("a fault credit and its bound are never negative")
    key = f"fault_credit:{reference}"
    with transaction.atomic():
        earned_key = (Kind.PROVIDER_EARNED, provider_id)
        locked = _lock_accounts([earned_key])
        done = JournalEntry.objects.filter(idempotency_key=key).first()
        if done is not None:
            return sum(p.amount for p in done.postings.all() if p.amount > 0)
        balance = locked.get(earned_key, (None, 0, False))[1]
        credit = min(amount, bound, balance)
        if credit <= 0:
            return 0
        earned = account(*earned_key)
        entry = post_entry(
            kind=JournalEntry.Kind.FAULT_CREDIT,
            postings=wallet_credit_postings(user_id=buyer_id, amount=credit, source=earned),
            memo=f"fault credit {format_usd(credit)} USD from provider {provider_id} to "
                 f"buyer {buyer_id}",
            reference=reference, idempotency_key=key)
        entry.evidence = evidence
        entry.save(update_fields=["evidence"])
    return credit
