"""settlement.capture.plan_capture, the one rule of what a capture takes (shared by the
one-at-a-time services and settlement.bulk), and the row-based metering batch's feed
notice (settlement.signals.entries_written)."""

import pytest
from django.db import transaction

from frontend import feed
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.capture import plan_capture
from settlement.models import Account, Hold, JournalEntry
from settlement.split import split
from tests.factories import funded_buyer, registered_node

Kind = Account.Kind
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("amount", [0, 1, 999_999, 1_000_000, 1_700_007, 2_500_000])
def test_a_capture_fills_the_holds_in_order_and_splits_85_15_exactly(amount):
    plan = plan_capture([1_000_000, 700_007, 800_000], buyer_id=7, amount=amount,
                        provider_id=9, release=False)
    takes = [take for take, _, _ in plan.shares]
    assert sum(takes) == amount
    assert takes[0] == min(amount, 1_000_000)
    assert plan.split == split(amount, 1500)
    assert sum(fee for _, fee, _ in plan.shares) == plan.split.platform_fee
    assert plan.split.platform_fee + plan.split.provider == amount
    assert sum(amt for _, amt in plan.postings) == 0
    assert dict(plan.postings)[(Kind.PROVIDER_EARNED, 9)] == plan.split.provider
    assert plan.released == 0 and all(rest == 0 for *_, rest in plan.shares)


def test_a_final_capture_releases_each_holds_rest():
    plan = plan_capture([1_000_000, 700_007], buyer_id=7, amount=1_200_000, provider_id=9,
                        release=True)
    assert plan.shares[0][0] + plan.shares[1][0] == 1_200_000
    assert [rest for *_, rest in plan.shares] == [0, 500_007] and plan.released == 500_007
    assert dict(plan.postings)[(Kind.BUYER_AVAILABLE, 7)] == 500_007
    assert dict(plan.postings)[(Kind.BUYER_HELD, 7)] == -1_700_007


@pytest.mark.ledger("ledger_only")  # holds without leases: the ledger's own checks only
def test_the_row_batch_writes_what_hold_capture_many_writes_and_notes_the_feed():
    provider, _, _ = registered_node()
    buyer = funded_buyer(100)
    holds = [ledger.hold_place(buyer_id=buyer.pk, amount=3_000_001 + i, reference=f"lease:{i}")
             for i in range(3)]
    charges = [ledger_bulk.Charge(hold_ids=[h.pk], cost=1_234_567 + i, provider_id=provider.pk,
                                  reference=f"lease:{i}", period="1")
               for i, h in enumerate(holds)]
    with transaction.atomic():
        before = set(feed.current_batch().entries)  # the test's own transaction's
        out = ledger_bulk.holds_capture_batch(charges)
        noted = set(feed.current_batch().entries) - before
    assert noted == {s.entry_id for s in out} and len(noted) == 3
    for i, (h, settled) in enumerate(zip(holds, out, strict=True)):
        h.refresh_from_db()
        assert settled.split == split(1_234_567 + i, 1500)
        assert (h.captured, h.captured_fee, h.amount) == (
            1_234_567 + i, settled.split.platform_fee, 3_000_001 + i - 1_234_567 - i)
        entry = JournalEntry.objects.get(pk=settled.entry_id)
        assert entry.idempotency_key == f"meter:lease:{i}:1" and entry.hold_id == h.pk
        assert sorted(entry.postings.values_list("amount", flat=True)) == sorted(
            [-(1_234_567 + i), settled.split.provider, settled.split.platform_fee])
    assert ledger_bulk.holds_capture_batch(charges) == [None] * 3  # the same period again
    assert Hold.objects.get(pk=holds[0].pk).captured == 1_234_567
    assert ledger.wallet(user_id=provider.pk).earned == sum(s.split.provider for s in out)
    assert ledger.wallet(user_id=buyer.pk).held == sum(3_000_001 + i - 1_234_567 - i
                                                       for i in range(3))
