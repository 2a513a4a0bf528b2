"""Interruptible bids and preemption (DESIGN.md "Interruptible leases"; the rule is in
docs/MATCHING.md), on PostgreSQL, with explicit `now=` instead of sleeping; the leases
offered again once they become preemptible: test_preemption_reconsider.py."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from marketplace import book, tasks
from marketplace.lease_end import preempt_due_leases, preempt_lease
from marketplace.models import Lease, LeaseEvent, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from settlement.money import lease_cost
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.marketplace.preemption_support import (  # noqa: F401  (notice_period: autouse)
    ASK,
    HOUR,
    MARKET,
    NOTICE,
    assert_no_gpu_twice,
    bid,
    full_node,
    notice_period,
)
from tests.support.api import client_for, runner_client


@pytest.mark.django_db
def test_higher_bid_preempts_the_cheapest_interruptible_lease_after_the_notice():
    t0 = timezone.now() - timedelta(minutes=30)
    _provider, _node, token, ask, (_high, high_lease), (low, low_lease) = full_node(t0)
    low_before = ledger.wallet(user_id=low.pk)
    buyer = funded_buyer(100)

    t1 = t0 + timedelta(seconds=1000)
    placed = bid(buyer, 3_000_000, now=t1)  # not interruptible, outbids both
    assert placed.leases == [] and placed.order.status == "open"  # rests, holding its hold
    assert Hold.objects.get(pk=placed.order.hold_id).status == "active"
    deadline = t1 + timedelta(seconds=NOTICE)

    # only as many as needed: the cheaper (2.20) lease, not the 2.50 one
    low_lease.refresh_from_db()
    high_lease.refresh_from_db()
    assert low_lease.preempt_at == deadline and low_lease.preempted_for_id == placed.order.pk
    assert high_lease.preempt_at is None
    # its buyer is told at once: an event with the deadline, and the lease in the API
    ev = low_lease.events.order_by("-pk").first()
    assert ev.at == t1 and deadline.isoformat() in ev.cause
    assert ev.detail["preempt_at"] == deadline.isoformat()
    body = client_for(low).get(f"/api/v1/leases/{low_lease.pk}/").json()
    assert body["interruptible"] is True and body["preempt_at"] is not None
    assert any(deadline.isoformat() in e["cause"] for e in body["events"])
    # the runner sees the deadline too, and the lease is still active
    leases = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    by_id = {le["id"]: le for le in leases}
    assert by_id[low_lease.pk]["preempt_at"] is not None
    assert by_id[high_lease.pk]["preempt_at"] is None
    assert_no_gpu_twice()

    # before the deadline nothing happens
    assert preempt_due_leases(now=deadline - timedelta(seconds=1)) == []
    low_lease.refresh_from_db()
    assert low_lease.status == "running"
    low_gpus = set(low_lease.lease_gpus.values_list("gpu_id", flat=True))

    # at the deadline: preempted, charged exactly the seconds it ran, the rest released
    assert preempt_due_leases(now=deadline) == [low_lease.pk]
    low_lease.refresh_from_db()
    assert low_lease.status == "preempted" and low_lease.ended_at == deadline
    seconds = int((deadline - t0).total_seconds())
    assert low_lease.cost == lease_cost(ASK, 4, seconds)
    hold = Hold.objects.get(pk=low_lease.hold_id)
    assert hold.status == "captured" and hold.captured == low_lease.cost
    assert hold.released == lease_cost(ASK, 4, HOUR) - low_lease.cost
    low_after = ledger.wallet(user_id=low.pk)
    assert low_after.held == 0
    assert low_after.available == low_before.available + low_before.held - low_lease.cost
    assert low_lease.events.filter(to_status="preempted").count() == 1

    # the waiting bid fills at the ask's price, on the freed GPUs
    order = Order.objects.get(pk=placed.order.pk)
    assert order.status == "filled"
    [new_lease] = Lease.objects.filter(fill__bid=order)
    assert new_lease.price == ASK and new_lease.status == "pending"
    assert not new_lease.interruptible
    assert set(new_lease.lease_gpus.values_list("gpu_id", flat=True)) == low_gpus
    assert Hold.objects.get(pk=new_lease.hold_id).amount == lease_cost(ASK, 4, HOUR)
    assert Hold.objects.get(pk=order.hold_id).status == "released"
    high_lease.refresh_from_db()
    assert high_lease.status == "running" and high_lease.preempt_at is None
    assert_no_gpu_twice()
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0
    assert first_violation() is None

    # the beat task run again changes nothing
    state = (list(Lease.objects.order_by("pk").values_list("pk", "status", "preempt_at")),
             LeaseEvent.objects.count(), JournalEntry.objects.count(),
             ledger.wallet(user_id=low.pk), ledger.wallet(user_id=buyer.pk))
    assert preempt_due_leases(now=deadline + timedelta(seconds=5)) == []
    assert tasks.preempt_due_leases.apply().get() == []
    assert state == (list(Lease.objects.order_by("pk").values_list("pk", "status", "preempt_at")),
                     LeaseEvent.objects.count(), JournalEntry.objects.count(),
                     ledger.wallet(user_id=low.pk), ledger.wallet(user_id=buyer.pk))
    # the runner no longer lists it: it stops the container
    leases = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert low_lease.pk not in {le["id"] for le in leases}


@pytest.mark.django_db
@pytest.mark.parametrize("price", [2_200_000, 2_100_000, ASK, 1_000_000])
def test_an_equal_or_lower_bid_preempts_nothing(price):
    t0 = timezone.now() - timedelta(minutes=5)
    full_node(t0)
    placed = bid(funded_buyer(100), price, now=t0 + timedelta(seconds=10))
    assert placed.order.status == "open"
    assert not Lease.objects.filter(preempt_at__isnull=False).exists()
    assert preempt_due_leases(now=t0 + timedelta(days=1)) == []
    assert Lease.objects.filter(status="running").count() == 2


@pytest.mark.django_db
def test_a_non_interruptible_lease_is_never_preempted():
    t0 = timezone.now() - timedelta(minutes=5)
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=ASK,
                   gpus=8, available_until=in_a_day(), now=t0)
    [lease] = bid(funded_buyer(100), ASK, gpus=8, now=t0).leases
    assert not lease.interruptible
    placed = bid(funded_buyer(1000), 50_000_000, gpus=8, now=t0 + timedelta(seconds=1))
    assert placed.order.status == "open"
    lease.refresh_from_db()
    assert lease.preempt_at is None
    assert preempt_due_leases(now=t0 + timedelta(days=1)) == []
    lease.refresh_from_db()
    assert lease.status == "pending"


@pytest.mark.django_db
def test_an_interruptible_bid_preempts_only_interruptible_leases_bid_strictly_lower():
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_high, high_lease), (_low, low_lease) = full_node(t0)
    # an interruptible bid at 2.30: above the 2.20 lease, below the 2.50 one
    placed = bid(funded_buyer(100), 2_300_000, gpus=8, gang_size=4, interruptible=True,
                 now=t0 + timedelta(seconds=1))
    low_lease.refresh_from_db()
    high_lease.refresh_from_db()
    assert low_lease.preempted_for_id == placed.order.pk and high_lease.preempt_at is None
    # a second, non-interruptible bid at 2.25 finds the 2.20 lease already scheduled and
    # does not outbid the 2.50 one: nothing more is scheduled
    later = bid(funded_buyer(100), 2_250_000, now=t0 + timedelta(seconds=2)).order
    assert list(Lease.objects.filter(preempt_at__isnull=False)) == [low_lease]
    preempt_due_leases(now=t0 + timedelta(seconds=1 + NOTICE))
    order = Order.objects.get(pk=placed.order.pk)
    assert order.status == "partially_filled" and order.remaining_gpus == 4
    assert Order.objects.get(pk=later.pk).status == "open"  # price priority: 2.30 first
    [won] = Lease.objects.filter(fill__bid=order)
    assert won.interruptible and won.price == ASK
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_freed_gpus_go_by_price_time_priority():
    """The freed GPUs return to the ask and the normal matching gives them out: a higher
    bid that arrived during the notice takes them before the bid that preempted."""
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_low, low_lease) = full_node(t0)
    first = bid(funded_buyer(100), 2_300_000, now=t0).order
    second = bid(funded_buyer(100), 2_400_000, now=t0 + timedelta(seconds=1)).order
    low_lease.refresh_from_db()
    assert low_lease.preempted_for_id == first.pk
    assert Lease.objects.filter(preempt_at__isnull=False).count() == 1  # nothing for `second`
    preempt_due_leases(now=low_lease.preempt_at)
    assert Order.objects.get(pk=second.pk).status == "filled"
    assert Order.objects.get(pk=first.pk).status == "open"
    assert Lease.objects.get(fill__bid=second).price == ASK
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_ioc_and_fok_bids_do_not_rest_and_preempt_nothing():
    t0 = timezone.now() - timedelta(minutes=5)
    full_node(t0)
    for tif in ("IOC", "FOK"):
        placed = bid(funded_buyer(100), 9_000_000, time_in_force=tif, now=t0)
        assert placed.order.status == "cancelled"
    assert not Lease.objects.filter(preempt_at__isnull=False).exists()


@pytest.mark.django_db
def test_a_pending_lease_preempted_pays_nothing():
    t0 = timezone.now() - timedelta(minutes=5)
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=ASK,
                   gpus=8, available_until=in_a_day(), now=t0)
    victim = funded_buyer(100)
    [lease] = bid(victim, ASK, gpus=8, interruptible=True, now=t0).leases
    placed = bid(funded_buyer(100), 3_000_000, gpus=8, now=t0)
    assert preempt_due_leases(now=t0 + timedelta(seconds=NOTICE)) == [lease.pk]
    lease.refresh_from_db()
    assert lease.status == "preempted" and lease.cost == 0
    assert ledger.wallet(user_id=victim.pk) == ledger.Wallet(available=100_000_000, held=0,
                                                              earned=0)
    assert Order.objects.get(pk=placed.order.pk).status == "filled"
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_gang_fit_counts_what_the_ask_still_offers_and_a_withdrawn_ask_keeps_gpus_free():
    t0 = timezone.now() - timedelta(minutes=5)
    provider, node, _ = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=ASK, gpus=8, available_until=in_a_day(), now=t0).order
    [cheap] = bid(funded_buyer(100), 2_100_000, gpus=2, interruptible=True, now=t0).leases
    [dear] = bid(funded_buyer(100), 2_200_000, gpus=2, interruptible=True, now=t0).leases
    # the ask still offers 4; a gang of 6 needs 2 more: the cheaper lease alone
    placed = bid(funded_buyer(100), 3_000_000, gpus=6, now=t0 + timedelta(seconds=1))
    assert placed.order.status == "open"
    cheap.refresh_from_db()
    dear.refresh_from_db()
    assert cheap.preempt_at is not None and dear.preempt_at is None
    # the provider withdraws the ask meanwhile: the preemption still happens, the freed
    # GPUs stay free and the bid keeps waiting
    book.cancel_order(user_id=provider.pk, order_id=ask.pk)
    assert preempt_due_leases(now=cheap.preempt_at) == [cheap.pk]
    cheap.refresh_from_db()
    assert cheap.status == "preempted"
    assert not cheap.lease_gpus.filter(active=True).exists()
    assert Order.objects.get(pk=placed.order.pk).status == "open"
    assert Lease.objects.filter(status__in=Lease.ACTIVE).count() == 1  # `dear` only
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_preemption_is_called_off_when_the_waiting_bid_is_gone():
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_low, victim) = full_node(t0)
    buyer = funded_buyer(1000)
    placed = bid(buyer, 3_000_000, gpus=4, now=t0)
    assert Lease.objects.get(preempt_at__isnull=False) == victim
    book.cancel_order(user_id=buyer.pk, order_id=placed.order.pk)
    assert preempt_due_leases(now=t0 + timedelta(seconds=NOTICE)) == []
    victim.refresh_from_db()
    assert victim.status == "running" and victim.preempt_at is None
    assert "called off" in victim.events.order_by("-pk").first().cause
    assert Hold.objects.get(pk=placed.order.hold_id).status == "released"


@pytest.mark.django_db(transaction=True)
def test_concurrent_beat_runs_preempt_once():
    from tests.factories import ensure_catalog

    ensure_catalog()
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_low, low_lease) = full_node(t0)
    placed = bid(funded_buyer(100), 3_000_000, now=t0)
    deadline = t0 + timedelta(seconds=NOTICE)
    results: list = []
    errors: list = []
    start = threading.Barrier(6)

    def worker():
        try:
            start.wait(timeout=30)
            results.append(preempt_lease(lease_id=low_lease.pk, now=deadline))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sum(r is not None for r in results) == 1
    low_lease.refresh_from_db()
    assert low_lease.status == "preempted"
    assert low_lease.events.filter(to_status="preempted").count() == 1
    assert Lease.objects.filter(fill__bid_id=placed.order.pk).count() == 1
    assert JournalEntry.objects.filter(reference=f"lease:{low_lease.pk}",
                                       kind=JournalEntry.Kind.LEASE_SETTLE).count() == 1
    assert_no_gpu_twice()
    assert first_violation() is None


# --- API --------------------------------------------------------------------------------

def _bid_body(**extra):
    return {"side": "bid", "gpu_class": MARKET, "price": "3.00", "gpus": 4, "hours": 1,
            **extra}


@pytest.mark.django_db
def test_api_interruptible_is_a_json_bool_default_false():
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=ASK,
                   gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)
    client = client_for(buyer)
    for bad in ("true", 1, 0, "false", None, [], {}):
        r = client.post("/api/v1/orders/", _bid_body(interruptible=bad), format="json")
        assert r.status_code == 400, (bad, r.content)
        assert "interruptible" in r.json()["errors"], r.json()
    assert not Order.objects.filter(side="bid").exists()

    r = client.post("/api/v1/orders/", _bid_body(interruptible=True), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["interruptible"] is True
    [lease_id] = r.json()["leases"]
    lease = client.get(f"/api/v1/leases/{lease_id}/").json()
    assert lease["interruptible"] is True and lease["preempt_at"] is None

    r = client.post("/api/v1/orders/", _bid_body(), format="json")
    assert r.status_code == 201 and r.json()["interruptible"] is False
    assert Lease.objects.get(pk=r.json()["leases"][0]).interruptible is False

    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 1,
        "available_until": in_a_day().isoformat(), "interruptible": True}, format="json")
    assert r.status_code == 400 and "interruptible" in r.json()["errors"]
