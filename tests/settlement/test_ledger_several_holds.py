"""A lease secured by several holds (its own and one per extension): periodic captures and
the final settlement fill them in order, split once per capture over the whole amount (the
holds' fee shares sum to it exactly), release every hold's rest and close them all, in one
journal entry each time."""

import pytest

from settlement import services as ledger
from settlement.checks import LEDGER_CHECKS, first_violation
from settlement.models import Hold, JournalEntry
from settlement.split import split
from tests.factories import UserFactory, funded_buyer

pytestmark = [pytest.mark.django_db, pytest.mark.ledger("ledger_only")]


def _holds(buyer, *amounts):
    return [ledger.hold_place(buyer_id=buyer.pk, amount=a, reference=f"test:{i}")
            for i, a in enumerate(amounts)]


def test_capture_and_settle_fill_the_holds_in_order_and_split_exactly():
    buyer, provider = funded_buyer(1), UserFactory()
    first, second = _holds(buyer, 1000, 333)
    ids = [first.pk, second.pk]
    metered = ledger.hold_capture_many(hold_ids=ids, through_cost=1200,
                                       provider_id=provider.pk, reference="lease:1",
                                       period="1")
    assert metered.split == split(1200, 1500) and metered.released == 0
    first.refresh_from_db(), second.refresh_from_db()
    assert (first.captured, first.captured_fee, first.amount) == (1000, 150, 0)
    assert (second.captured, second.captured_fee, second.amount) == (200, 30, 133)
    assert ledger.hold_capture_many(hold_ids=ids, through_cost=1200, provider_id=provider.pk,
                                    reference="lease:1", period="1") is None  # once

    entries = JournalEntry.objects.count()
    settled = ledger.hold_settle_many(hold_ids=ids, cost=1290, provider_id=provider.pk,
                                      reference="lease:1")
    assert JournalEntry.objects.count() == entries + 1
    assert settled.split == split(90, 1500) and settled.released == 43
    assert (settled.captured_total, settled.fee_total) == (1290, 150 + 30 + 13)
    assert {h.status for h in Hold.objects.filter(pk__in=ids)} == {"captured"}
    assert sum(h.captured_fee for h in Hold.objects.filter(pk__in=ids)) == 193
    w = ledger.wallet(user_id=buyer.pk)
    assert (w.available, w.held) == (1_000_000 - 1290, 0)
    assert ledger.wallet(user_id=provider.pk).earned == 1290 - 193
    assert first_violation(LEDGER_CHECKS) is None


def test_one_capture_across_two_holds_pays_the_split_of_the_whole():
    buyer, provider = funded_buyer(1), UserFactory()
    ids = [h.pk for h in _holds(buyer, 3, 4)]
    settled = ledger.hold_settle_many(hold_ids=ids, cost=7, provider_id=provider.pk,
                                      reference="lease:2")
    # split per hold would give the platform 3 × 0.15 → 0 plus 4 × 0.15 → 0
    assert settled.split == split(7, 1500) == (7, 1, 6) and settled.fee_total == 1
    assert [h.captured_fee for h in Hold.objects.filter(pk__in=ids).order_by("pk")] == [0, 1]


def test_settling_beyond_the_holds_or_on_a_closed_one_is_refused_and_writes_nothing():
    buyer, provider = funded_buyer(1), UserFactory()
    ids = [h.pk for h in _holds(buyer, 100, 50)]
    with pytest.raises(ValueError):
        ledger.hold_settle_many(hold_ids=ids, cost=151, provider_id=provider.pk,
                                reference="lease:4")
    with pytest.raises(ValueError):
        ledger.hold_capture_many(hold_ids=ids, through_cost=151, provider_id=provider.pk,
                                 reference="lease:4", period="1")
    ledger.hold_release(hold_id=ids[1], cause="test")
    entries = JournalEntry.objects.count()
    with pytest.raises(ledger.HoldClosed):
        ledger.hold_settle_many(hold_ids=ids, cost=10, provider_id=provider.pk,
                                reference="lease:4")
    assert JournalEntry.objects.count() == entries
    assert Hold.objects.get(pk=ids[0]).status == "active"
