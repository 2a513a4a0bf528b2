"""The market's ledger invariants (registered with settlement.checks) catch what they
promise to catch, and `manage.py ledger_check` exits non-zero naming it."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from marketplace import book
from marketplace.models import Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Account, JournalEntry
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db


def _market_with_a_bid():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=1_000_000, gpus=2,
                   duration_seconds=3600)
    return provider, buyer


def test_a_consistent_market_passes_ledger_check(capsys):
    _market_with_a_bid()
    call_command("ledger_check")
    assert "ledger is consistent" in capsys.readouterr().out


@pytest.mark.ledger("violates")
def test_an_orphan_hold_is_named():
    _, buyer = _market_with_a_bid()
    orphan = ledger.hold_place(buyer_id=buyer.pk, amount=1, reference="nothing")
    assert first_violation() == f"hold {orphan.pk} is active but secures no open bid or lease"
    with pytest.raises(CommandError, match="holds_match_open_bids_and_leases"):
        call_command("ledger_check")


@pytest.mark.ledger("violates")
def test_a_bid_whose_hold_was_released_is_named():
    _market_with_a_bid()
    bid = Order.objects.get(side="bid")
    ledger.hold_release(hold_id=bid.hold_id, cause="bug")
    assert first_violation() == (f"order {bid.pk} is secured by hold {bid.hold_id}, "
                                 "which is not active")


@pytest.mark.ledger("violates")
def test_earnings_without_a_lease_are_named():
    provider, _ = _market_with_a_bid()
    ledger.post_entry(kind=JournalEntry.Kind.DEV_CREDIT, postings=[
        (ledger.account(Account.Kind.EXTERNAL_DEV_CREDIT), -5),
        (ledger.account(Account.Kind.PROVIDER_EARNED, provider.pk), 5)])
    assert first_violation() == (f"provider {provider.pk}: the ledger holds 5 micro-USD of "
                                 "earnings, its leases account for 0")
