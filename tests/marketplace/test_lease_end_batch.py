"""The worker's batched lease end (end_overdue_leases → end_leases_batch): several leases
of one market ended under one market lock settle exactly as end_lease one by one."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction

from marketplace import book
from marketplace.lease_end import end_lease, end_leases_batch, end_overdue_leases
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_490_001
MARKET = "h100-sxm-80gb"


class _Rollback(Exception):
    pass


def _two_running_leases_and_a_resting_bid():
    """An ask of 4 GPUs sold as two running leases of 2 (two buyers), and a resting bid of
    3 GPUs that the returned GPUs re-match."""
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=PRICE,
                   gpus=4, available_until=in_a_day())
    leases = []
    for _ in range(2):
        buyer = funded_buyer(1000)
        [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=PRICE, gpus=2,
                                 duration_seconds=3600).leases
        leases.append(mark_running(lease=lease, container_id="e" * 64))
    waiting = funded_buyer(1000)
    resting = book.place_bid(buyer_id=waiting.pk, market_slug=MARKET, price=PRICE, gpus=3,
                             duration_seconds=3600).order
    return provider, [lease.pk for lease in leases], waiting, resting


def _outcome(provider, lease_ids, waiting, resting):
    """What the ends wrote: each lease's settlement, its holds, the wallets, the ask, the
    re-matched bid and its new leases, the journal."""
    ended = [Lease.objects.get(pk=pk) for pk in lease_ids]
    ask = Order.objects.get(pk=ended[0].ask_id)
    rest = Order.objects.get(pk=resting.pk)
    ours = {f"lease:{pk}" for pk in lease_ids} | {
        e.reference for e in JournalEntry.objects.exclude(reference__startswith="lease:")}
    return {
        "leases": [(x.status, x.cost, x.platform_fee, x.provider_amount, x.cause)
                   for x in ended],
        "holds": [(h.status, h.captured) for h in
                  Hold.objects.filter(pk__in=[x.hold_id for x in ended]).order_by("pk")],
        "wallets": [ledger.wallet(user_id=u).__dict__ for u in
                    (provider.pk, ended[0].buyer_id, ended[1].buyer_id, waiting.pk)],
        "ask": (ask.status, ask.remaining_gpus),
        "resting": (rest.status, rest.remaining_gpus),
        "new_leases": sorted((x.gpu_count, x.price, x.ask_id) for x in
                             Lease.objects.filter(fill__bid_id=resting.pk)),
        # a re-matched lease's id differs between the two runs (sequences do not roll back)
        "journal": sorted((e.kind, e.reference if e.reference in ours else "lease:new")
                          for e in JournalEntry.objects.all()),
    }


def test_two_leases_of_one_market_in_one_batch_settle_exactly_as_one_by_one():
    provider, ids, waiting, resting = _two_running_leases_and_a_resting_bid()
    start = Lease.objects.get(pk=ids[0]).started_at
    now = start + timedelta(hours=1, seconds=settings.GPUMARKET_LEASE_GRACE_SECONDS + 30)
    cause = "lease time is over; the runner did not report the end"

    try:
        with transaction.atomic():
            for pk in ids:
                end_lease(lease_id=pk, status="completed", cause=cause, now=now)
            one_by_one = _outcome(provider, ids, waiting, resting)
            raise _Rollback
    except _Rollback:
        pass
    assert Lease.objects.get(pk=ids[0]).status == "running"  # rolled back

    assert end_overdue_leases(now=now) == ids
    batched = _outcome(provider, ids, waiting, resting)

    assert batched == one_by_one
    assert batched["leases"][0][0] == "completed" and batched["new_leases"]  # re-matched
    assert batched["ask"][1] == 1  # 4 returned, 3 sold again
    assert first_violation() is None


def test_a_lease_ended_meanwhile_is_skipped_and_a_second_sweep_does_nothing():
    _, ids, _, resting = _two_running_leases_and_a_resting_bid()
    start = Lease.objects.get(pk=ids[0]).started_at
    end_lease(lease_id=ids[0], status="completed", cause="runner: exit 0",
              now=start + timedelta(minutes=30))
    now = start + timedelta(hours=2)
    assert end_leases_batch(market_id=resting.market_id, lease_ids=ids, status="completed",
                            cause="over", now=now) == [ids[1]]
    first = Lease.objects.get(pk=ids[0])
    assert (first.cause, first.ended_at) == ("runner: exit 0", start + timedelta(minutes=30))
    assert end_overdue_leases(now=now) == []
    assert first_violation() is None


def test_batches_of_one_end_every_due_lease():
    _, ids, _, _ = _two_running_leases_and_a_resting_bid()
    start = Lease.objects.get(pk=ids[0]).started_at
    assert end_overdue_leases(now=start + timedelta(hours=2), batch=1) == ids
    assert set(Lease.objects.filter(pk__in=ids).values_list("status", flat=True)) \
        == {"completed"}
    assert first_violation() is None
