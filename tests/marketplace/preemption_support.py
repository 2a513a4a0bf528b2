"""What the preemption tests share (tests/marketplace/test_preemption*.py): the market,
prices and notice, the autouse notice setting, the no-GPU-twice check, a bid and a full
node of two interruptible leases."""

from __future__ import annotations

import pytest

from marketplace import book
from marketplace.leases import mark_running
from marketplace.models import Lease, LeaseGpu
from tests.factories import funded_buyer, in_a_day, registered_node

MARKET = "h100-sxm-80gb"
ASK = 2_000_000  # micro-USD per GPU-hour
HOUR = 3600
NOTICE = 120


@pytest.fixture(autouse=True)
def notice_period(settings):
    settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS = NOTICE


def assert_no_gpu_twice() -> None:
    active = list(LeaseGpu.objects.filter(active=True).values_list("gpu_id", flat=True))
    assert len(active) == len(set(active))
    # and only unended leases hold GPUs
    assert not LeaseGpu.objects.filter(active=True, lease__status__in=Lease.ENDED).exists()


def bid(buyer, price, gpus=4, *, interruptible=False, now=None, **kw) -> book.Placed:
    return book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=price, gpus=gpus,
                          duration_seconds=HOUR, interruptible=interruptible, now=now, **kw)


def full_node(t0):
    """A provider's 8 H100s on offer at ASK, taken by two interruptible 4-GPU leases: one
    bid at 2.50 (running since t0), one bid at 2.20 (running since t0). Both trade at the
    ask's price."""
    provider, node, token = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=ASK,
                         gpus=8, available_until=in_a_day(), now=t0).order
    high, low = funded_buyer(100), funded_buyer(100)
    [high_lease] = bid(high, 2_500_000, interruptible=True, now=t0).leases
    [low_lease] = bid(low, 2_200_000, interruptible=True, now=t0).leases
    assert high_lease.interruptible and low_lease.interruptible
    assert high_lease.price == low_lease.price == ASK
    high_lease = mark_running(lease=high_lease, container_id="h" * 64, now=t0)
    low_lease = mark_running(lease=low_lease, container_id="l" * 64, now=t0)
    return provider, node, token, ask, (high, high_lease), (low, low_lease)


