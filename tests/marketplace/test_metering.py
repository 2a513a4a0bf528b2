"""Periodic settlement of long leases (metering) and its exact split."""

from datetime import timedelta

import pytest

from marketplace import book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running, meter_lease, meter_running_leases
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from settlement.money import lease_cost
from settlement.split import split
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_490_001  # an odd price so the per-period floors show


def _running_lease(hours: int = 3):
    provider, node, _ = registered_node()
    buyer = funded_buyer(1000)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=PRICE,
                   gpus=3, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=PRICE,
                             gpus=3, duration_seconds=hours * 3600).leases
    return provider, buyer, mark_running(lease=lease, container_id="m" * 64)


def test_hourly_metering_pays_the_provider_for_what_ran_once_per_period():
    provider, buyer, lease = _running_lease()
    t0 = lease.started_at
    assert meter_lease(lease_id=lease.pk, now=t0 + timedelta(minutes=59)) is None
    first = meter_lease(lease_id=lease.pk, now=t0 + timedelta(hours=1, minutes=5))
    assert first == lease_cost(PRICE, 3, 3600)
    assert meter_lease(lease_id=lease.pk, now=t0 + timedelta(hours=1, minutes=30)) is None
    assert meter_running_leases(now=t0 + timedelta(hours=1, minutes=40)) == []
    earned_after_1h = ledger.wallet(user_id=provider.pk).earned
    assert earned_after_1h == split(first, 1500).provider

    second = meter_lease(lease_id=lease.pk, now=t0 + timedelta(hours=2, seconds=1))
    assert second == lease_cost(PRICE, 3, 7200) - first
    assert first_violation() is None

    # the lease fails at 2 h 30 min: it pays for exactly 9000 seconds in all
    ended = end_lease(lease_id=lease.pk, status="failed", cause="GPU lost",
                      now=t0 + timedelta(hours=2, minutes=30))
    cost = lease_cost(PRICE, 3, 9000)
    parts = [first, second, cost - first - second]
    fee = sum(split(p, 1500).platform_fee for p in parts)
    assert ended.cost == cost
    assert ended.platform_fee == fee
    assert ended.provider_amount == cost - fee
    # per-period rounding never gives the platform more than the split of the whole
    assert 0 <= split(cost, 1500).platform_fee - fee < len(parts)
    assert ledger.wallet(user_id=provider.pk).earned == cost - fee
    assert ledger.wallet(user_id=buyer.pk).held == 0
    hold = Hold.objects.get(pk=lease.hold_id)
    assert hold.captured == cost and hold.status == "captured"
    assert JournalEntry.objects.filter(kind="lease_meter").count() == 2
    assert first_violation() is None


def test_metering_a_lease_that_is_not_running_does_nothing():
    _, _, lease = _running_lease()
    end_lease(lease_id=lease.pk, status="completed", cause="done",
              now=lease.started_at + timedelta(minutes=10))
    assert meter_lease(lease_id=lease.pk, now=lease.started_at + timedelta(hours=2)) is None
    assert JournalEntry.objects.filter(kind="lease_meter").count() == 0
