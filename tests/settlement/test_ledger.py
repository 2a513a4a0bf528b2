import pytest

from settlement import services as ledger
from settlement.checks import LEDGER_CHECKS, first_violation
from settlement.models import Account, Hold, JournalEntry
from tests.factories import UserFactory, funded_buyer

pytestmark = [pytest.mark.django_db, pytest.mark.ledger("ledger_only")]


def test_hold_then_settle_pays_85_15_and_releases_the_rest():
    buyer, provider = funded_buyer(100), UserFactory()
    hold = ledger.hold_place(buyer_id=buyer.pk, amount=10_000_000, reference="order:1")
    assert ledger.wallet(user_id=buyer.pk).available == 90_000_000
    assert ledger.wallet(user_id=buyer.pk).held == 10_000_000

    settled = ledger.hold_settle(hold_id=hold.pk, cost=3_333_333, provider_id=provider.pk,
                                 reference="lease:1")

    assert settled.split.platform_fee == 3_333_333 * 1500 // 10_000 == 499_999
    assert settled.split.provider == 3_333_333 - 499_999
    assert settled.released == 10_000_000 - 3_333_333
    assert ledger.wallet(user_id=provider.pk).earned == 2_833_334
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - 3_333_333
    assert ledger.wallet(user_id=buyer.pk).held == 0
    platform = Account.objects.get(kind=Account.Kind.PLATFORM_REVENUE)
    assert platform.balance == 499_999
    assert first_violation(LEDGER_CHECKS) is None


def test_settle_happens_once():
    buyer, provider = funded_buyer(10), UserFactory()
    hold = ledger.hold_place(buyer_id=buyer.pk, amount=1_000_000, reference="order:2")
    ledger.hold_settle(hold_id=hold.pk, cost=500_000, provider_id=provider.pk,
                       reference="lease:2")
    entries = JournalEntry.objects.count()
    with pytest.raises(ledger.HoldClosed):
        ledger.hold_settle(hold_id=hold.pk, cost=500_000, provider_id=provider.pk,
                           reference="lease:2")
    with pytest.raises(ledger.HoldClosed):
        ledger.hold_release(hold_id=hold.pk, cause="again")
    assert JournalEntry.objects.count() == entries
    assert ledger.wallet(user_id=provider.pk).earned == 425_000


def test_hold_beyond_balance_is_refused_and_writes_nothing():
    buyer = funded_buyer(1)
    before = (JournalEntry.objects.count(), Hold.objects.count())
    with pytest.raises(ledger.InsufficientFunds, match="insufficient balance"):
        ledger.hold_place(buyer_id=buyer.pk, amount=1_000_001, reference="order:3")
    assert (JournalEntry.objects.count(), Hold.objects.count()) == before
    assert ledger.wallet(user_id=buyer.pk).available == 1_000_000


def test_unbalanced_entry_is_refused():
    buyer = funded_buyer(1)
    with pytest.raises(ValueError, match="does not balance"):
        ledger.post_entry(kind="dev_credit",
                          postings=[(ledger.account("buyer_available", buyer.pk), 5)])


def test_database_refuses_a_negative_balance_even_past_the_service():
    from django.db import IntegrityError, transaction

    buyer = funded_buyer(1)
    acct = ledger.account("buyer_available", buyer.pk)
    with pytest.raises(IntegrityError), transaction.atomic():
        Account.objects.filter(pk=acct.pk).update(balance=-1)


@pytest.mark.ledger("violates")
def test_ledger_check_names_a_violation():
    buyer = funded_buyer(1)
    Account.objects.filter(owner=buyer, kind="buyer_available").update(balance=7)
    problem = first_violation(LEDGER_CHECKS)
    assert problem is not None and "differs from its postings' sum" in problem
