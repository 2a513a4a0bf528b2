"""Interruptible bids and preemption (DESIGN.md "Interruptible leases"; the rule is in
marketplace/book.py's docstring, "Preemption"), on PostgreSQL, with explicit `now=`
instead of sleeping."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace import book, locking, preemption, tasks
from marketplace.lease_end import end_lease, preempt_due_leases, preempt_lease
from marketplace.leases import mark_running
from marketplace.models import Lease, LeaseEvent, LeaseGpu, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold, JournalEntry
from settlement.money import lease_cost
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.api import client_for, runner_client

MARKET = "h100-sxm-80gb"
ASK = 2_000_000  # micro-USD per GPU-hour
HOUR = 3600
NOTICE = 120


@pytest.fixture(autouse=True)
def _notice(settings):
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
    assert JournalEntry.objects.filter(reference=f"lease:{low_lease.pk}").count() == 1
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


# --- reconsideration: leases that become preemptible after a bid rests ------------------

def scheduled(lease: Lease) -> tuple:
    lease.refresh_from_db()
    return lease.preempt_at, lease.preempted_for_id


def preemption_events(lease: Lease) -> list[LeaseEvent]:
    return list(lease.events.filter(cause__startswith="preemption at").order_by("pk"))


def partly_leased_ask(t0, *, kept: int, interruptible_gpus: int):
    """One provider's 8 H100s on offer at ASK: `kept` GPUs in a running non-interruptible
    lease, `interruptible_gpus` in a running interruptible lease bid at 2.20; the rest
    free."""
    provider, node, _ = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=ASK, gpus=8, available_until=in_a_day(), now=t0).order
    [kept_lease] = bid(funded_buyer(100), ASK, gpus=kept, now=t0).leases
    [victim] = bid(funded_buyer(100), 2_200_000, gpus=interruptible_gpus, interruptible=True,
                   now=t0).leases
    kept_lease = mark_running(lease=kept_lease, container_id="k" * 64, now=t0)
    victim = mark_running(lease=victim, container_id="v" * 64, now=t0)
    return ask, kept_lease, victim


@pytest.mark.django_db
@pytest.mark.parametrize("price", [3_000_000, 2_500_000])
def test_a_new_interruptible_lease_is_offered_at_once_to_a_higher_resting_bid(price):
    """A bid for a gang of 4 rests while the ask offers 2 free GPUs: it schedules the 2.20
    lease (2 GPUs), counting on the 2 free ones. An interruptible bid at 2.50 then takes
    those 2 free GPUs: the waiting bid would be 2 GPUs short at the deadline forever.
    Strictly above 2.50 it schedules the new lease at once, and nothing more; at 2.50
    (equal) it preempts nothing."""
    t0 = timezone.now() - timedelta(minutes=30)
    _ask, kept, victim = partly_leased_ask(t0, kept=4, interruptible_gpus=2)
    t1, t2 = t0 + timedelta(seconds=10), t0 + timedelta(seconds=20)
    waiting = bid(funded_buyer(100), price, gpus=4, now=t1).order
    assert waiting.status == "open"
    assert scheduled(victim) == (t1 + timedelta(seconds=NOTICE), waiting.pk)

    [newer] = bid(funded_buyer(100), 2_500_000, gpus=2, interruptible=True, now=t2).leases
    newer = mark_running(lease=newer, container_id="n" * 64, now=t2)
    assert scheduled(victim) == (t1 + timedelta(seconds=NOTICE), waiting.pk)  # unchanged
    assert scheduled(kept) == (None, None)
    if price == 2_500_000:
        assert scheduled(newer) == (None, None)
        assert preemption_events(newer) == []
        assert preempt_due_leases(now=t2 + timedelta(days=1)) == [victim.pk]
        assert Order.objects.get(pk=waiting.pk).status == "open"  # 2 free GPUs: no gang
        assert scheduled(newer) == (None, None)
        return

    deadline = t2 + timedelta(seconds=NOTICE)
    assert scheduled(newer) == (deadline, waiting.pk)
    [ev] = preemption_events(newer)  # its buyer is told at once, with the deadline
    assert ev.at == t2 and deadline.isoformat() in ev.cause
    assert ev.detail == {"preempt_at": deadline.isoformat(), "notice_seconds": NOTICE}
    body = client_for(newer.buyer).get(f"/api/v1/leases/{newer.pk}/").json()
    assert body["preempt_at"] is not None

    # the first deadline: 2 GPUs back on the ask, still no gang of 4; nothing more is
    # scheduled (the bid already has what it lacks)
    assert preempt_due_leases(now=t1 + timedelta(seconds=NOTICE)) == [victim.pk]
    assert Order.objects.get(pk=waiting.pk).status == "open"
    assert Lease.objects.filter(preempt_at__isnull=False, status__in=Lease.ACTIVE).get() \
        == newer
    # the second: the bid fills its gang on both victims' GPUs, at the ask's price
    freed = set(LeaseGpu.objects.filter(lease__in=[victim, newer]).values_list("gpu_id",
                                                                              flat=True))
    assert preempt_due_leases(now=deadline) == [newer.pk]
    newer.refresh_from_db()
    assert newer.status == "preempted" and newer.cost == lease_cost(ASK, 2, NOTICE)
    order = Order.objects.get(pk=waiting.pk)
    assert order.status == "filled"
    [won] = Lease.objects.filter(fill__bid=order)
    assert won.price == ASK and set(won.lease_gpus.values_list("gpu_id", flat=True)) == freed
    assert scheduled(kept) == (None, None) and kept.status == "running"
    assert_no_gpu_twice()
    assert first_violation() is None


@pytest.mark.django_db
def test_gpus_returned_to_an_ask_let_a_waiting_bid_preempt_at_once():
    """A bid for 8 GPUs on one node cannot use the 2.20 lease alone (4 GPUs, the other 4
    in a non-interruptible lease). When that lease ends its 4 GPUs go back to the ask —
    no gang of 8 yet — and the waiting bid schedules the 2.20 lease at once."""
    t0 = timezone.now() - timedelta(minutes=30)
    ask, kept, victim = partly_leased_ask(t0, kept=4, interruptible_gpus=4)
    waiting = bid(funded_buyer(100), 3_000_000, gpus=8, now=t0 + timedelta(seconds=10)).order
    assert waiting.status == "open" and scheduled(victim) == (None, None)

    t2 = t0 + timedelta(seconds=600)
    end_lease(lease_id=kept.pk, status="completed", cause="done", now=t2)
    ask.refresh_from_db()
    assert ask.remaining_gpus == 4 and Order.objects.get(pk=waiting.pk).status == "open"
    deadline = t2 + timedelta(seconds=NOTICE)
    assert scheduled(victim) == (deadline, waiting.pk)
    [ev] = preemption_events(victim)
    assert ev.at == t2 and ev.detail["preempt_at"] == deadline.isoformat()

    assert preempt_due_leases(now=deadline) == [victim.pk]
    order = Order.objects.get(pk=waiting.pk)
    assert order.status == "filled"
    [won] = Lease.objects.filter(fill__bid=order)
    assert won.gpu_count == 8 and won.price == ASK
    assert_no_gpu_twice()
    assert first_violation() is None


@pytest.mark.django_db
def test_a_bid_with_enough_victims_scheduled_gets_no_more():
    """The 2.20 lease, scheduled for a bid that is then cancelled, is called off and
    offered again: the only bid above it already has the 2.50 lease scheduled for its
    one gang, so it gets nothing more, now or when asked again."""
    t0 = timezone.now() - timedelta(minutes=5)
    _provider, _node, _token, ask, (_h, high_lease), (_l, low_lease) = full_node(t0)
    t1, t2 = t0 + timedelta(seconds=1), t0 + timedelta(seconds=2)
    first_buyer = funded_buyer(100)
    first = bid(first_buyer, 2_600_000, now=t1).order
    waiting = bid(funded_buyer(100), 3_000_000, now=t2).order
    assert scheduled(low_lease) == (t1 + timedelta(seconds=NOTICE), first.pk)
    assert scheduled(high_lease) == (t2 + timedelta(seconds=NOTICE), waiting.pk)

    book.cancel_order(user_id=first_buyer.pk, order_id=first.pk)
    assert preempt_due_leases(now=t1 + timedelta(seconds=NOTICE)) == []
    assert scheduled(low_lease)[0] is None
    assert "called off" in low_lease.events.order_by("-pk").first().cause
    assert len(preemption_events(low_lease)) == 1  # the first notice only
    assert scheduled(high_lease) == (t2 + timedelta(seconds=NOTICE), waiting.pk)
    events = LeaseEvent.objects.count()
    for later in (10, 100):  # asked again: nothing changes
        with transaction.atomic():
            locking.lock_market(ask.market_id)
            assert preemption.reconsider_preemptions(ask.market_id,
                                               t0 + timedelta(seconds=later)) == []
    assert LeaseEvent.objects.count() == events

    assert preempt_due_leases(now=t2 + timedelta(seconds=NOTICE)) == [high_lease.pk]
    assert Order.objects.get(pk=waiting.pk).status == "filled"
    low_lease.refresh_from_db()
    assert low_lease.status == "running" and low_lease.preempt_at is None
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_a_called_off_preemption_is_offered_to_the_next_higher_bid():
    """Called off (its bid cancelled), the 2.20 lease goes at once to the highest, oldest
    resting bid that strictly outbids it and outlives the new notice: not to a bid that
    expires before that deadline, not to a younger bid at the same price."""
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_h, high_lease), (_l, low_lease) = full_node(t0)
    first_buyer = funded_buyer(100)
    first = bid(first_buyer, 3_000_000, now=t0 + timedelta(seconds=1)).order
    called_off = t0 + timedelta(seconds=1 + NOTICE)
    older = bid(funded_buyer(100), 2_400_000, now=t0 + timedelta(seconds=2)).order
    younger = bid(funded_buyer(100), 2_400_000, now=t0 + timedelta(seconds=3)).order
    short = bid(funded_buyer(100), 2_450_000, now=t0 + timedelta(seconds=4),
                expires_at=called_off + timedelta(seconds=NOTICE // 2)).order
    assert Lease.objects.filter(preempt_at__isnull=False).get() == low_lease
    assert scheduled(high_lease) == (None, None)  # 2.50: above all three

    # cancelled (at the moment the deadline would have come): called off at once
    book.cancel_order(user_id=first_buyer.pk, order_id=first.pk, now=called_off)
    assert preempt_due_leases(now=called_off) == []
    deadline = called_off + timedelta(seconds=NOTICE)
    assert scheduled(low_lease) == (deadline, older.pk)
    called, notice = low_lease.events.order_by("-pk")[:2][::-1]
    assert "called off" in called.cause
    assert notice.at == called_off and deadline.isoformat() in notice.cause
    assert scheduled(high_lease) == (None, None)

    assert preempt_due_leases(now=deadline) == [low_lease.pk]
    assert Order.objects.get(pk=older.pk).status == "filled"
    assert Order.objects.get(pk=younger.pk).status == "open"
    assert Order.objects.get(pk=short.pk).status == "expired"
    assert Lease.objects.get(fill__bid=older).price == ASK
    assert_no_gpu_twice()
    assert first_violation() is None


@pytest.mark.django_db
@pytest.mark.parametrize("price", [2_200_000, 2_200_001])
def test_a_called_off_preemption_goes_only_to_a_strictly_higher_bid(price):
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_h, high_lease), (_l, low_lease) = full_node(t0)
    first_buyer = funded_buyer(100)
    first = bid(first_buyer, 3_000_000, now=t0).order
    other = bid(funded_buyer(100), price, now=t0 + timedelta(seconds=1)).order
    called_off = t0 + timedelta(seconds=NOTICE)
    book.cancel_order(user_id=first_buyer.pk, order_id=first.pk, now=called_off)
    assert preempt_due_leases(now=called_off) == []
    if price == 2_200_000:  # equal: never
        assert scheduled(low_lease) == (None, first.pk)  # called off, offered to none
        assert preempt_due_leases(now=t0 + timedelta(days=1)) == []
        assert Lease.objects.filter(status="running").count() == 2
    else:
        assert scheduled(low_lease) == (called_off + timedelta(seconds=NOTICE), other.pk)
    assert scheduled(high_lease) == (None, None)


@pytest.mark.django_db
def test_the_bid_path_reconsiders_only_after_a_new_interruptible_lease(monkeypatch):
    """A resting bid whose fills make no interruptible lease (the common case, even an
    interruptible bid that rests without a fill) never calls the reconsideration, so it
    costs not one statement more — even where the reconsideration would find work."""
    t0 = timezone.now() - timedelta(minutes=5)
    *_, (_h, high_lease), (_l, low_lease) = full_node(t0)
    waiting = bid(funded_buyer(100), 3_000_000, now=t0).order
    # a state the hooks never leave behind: the 2.20 lease unscheduled while a bid that
    # outbids it waits (so a reconsideration here would schedule it)
    Lease.objects.filter(pk=low_lease.pk).update(preempt_at=None, preempted_for=None)
    calls: list = []
    real = preemption.reconsider_preemptions

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    def statements(place) -> int:
        with transaction.atomic():
            with CaptureQueriesContext(connection) as queries:
                place()
            transaction.set_rollback(True)
        return len(queries)

    monkeypatch.setattr(preemption, "reconsider_preemptions", spy)
    plain = statements(lambda: bid(funded_buyer(100), 2_000_000, now=t0))
    resting_interruptible = statements(
        lambda: bid(funded_buyer(100), 2_000_000, interruptible=True, now=t0))
    assert calls == []
    monkeypatch.setattr(preemption, "reconsider_preemptions",
                        lambda *a, **k: pytest.fail("reconsidered"))
    assert statements(lambda: bid(funded_buyer(100), 2_000_000, now=t0)) == plain
    assert resting_interruptible == plain
    assert scheduled(low_lease) == (None, None)

    # what it costs where it runs: four reads here, and it finds the lease
    with transaction.atomic():
        locking.lock_market(low_lease.market_id)
        with CaptureQueriesContext(connection) as queries:
            assert real(low_lease.market_id, t0) == [low_lease]
    reads = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert len(reads) == 4
    assert scheduled(low_lease)[1] == waiting.pk and scheduled(high_lease) == (None, None)


@pytest.mark.django_db
def test_a_group_reconsiders_exactly_as_its_bids_one_by_one():
    """place_bids runs the reconsideration right after the bid that made the interruptible
    lease, over the bids placed so far (the group's later bids are written but not yet
    placed), so a group ends with the same preemptions as its bids placed one by one."""
    t0 = timezone.now() - timedelta(minutes=30)
    partly_leased_ask(t0, kept=4, interruptible_gpus=2)
    later = t0 + timedelta(seconds=10)
    requests = [
        book.BidRequest(buyer_id=funded_buyer(100).pk, market_slug=MARKET, price=price,
                        gpus=gpus, duration_seconds=HOUR, interruptible=interruptible)
        for price, gpus, interruptible in [(3_000_000, 4, False), (2_500_000, 2, True),
                                           (3_500_000, 2, False)]]

    def outcome():
        return sorted((le.fill.bid.price, le.status, le.preempt_at,
                       le.preempted_for.price if le.preempted_for else None)
                      for le in Lease.objects.select_related("fill__bid", "preempted_for"))

    with transaction.atomic():
        for r in requests:
            book.place_bids([r], now=later)
        expected = outcome()
        transaction.set_rollback(True)
    grouped = book.place_bids(requests, now=later)
    assert all(isinstance(r, book.Placed) for r in grouped)
    assert outcome() == expected
    deadline = later + timedelta(seconds=NOTICE)
    # both interruptible leases go to the 3.00 bid's gang, none to the 3.50 bid placed
    # after them
    assert (2_200_000, "running", deadline, 3_000_000) in expected
    assert (2_500_000, "pending", deadline, 3_000_000) in expected
    assert_no_gpu_twice()


@pytest.mark.django_db
def test_one_pass_does_not_count_the_same_free_gpus_twice():
    """Two bids for a gang of 6 wait on a node whose 8 GPUs are leased: 4 kept, 2 at
    2.20 and 2 at 2.30 (interruptible). 4 GPUs come back: the higher bid counts on them
    with the 2.20 lease; the lower bid may not count on the same 4 again, so the 2.30
    lease is spared (preempted, it would free 2 GPUs that nobody can use)."""
    t0 = timezone.now() - timedelta(minutes=30)
    ask, kept, cheap = partly_leased_ask(t0, kept=4, interruptible_gpus=2)
    [dearer] = bid(funded_buyer(100), 2_300_000, gpus=2, interruptible=True, now=t0).leases
    higher = bid(funded_buyer(100), 3_000_000, gpus=6, now=t0).order
    lower = bid(funded_buyer(100), 2_900_000, gpus=6, now=t0).order
    assert not Lease.objects.filter(preempt_at__isnull=False).exists()  # 4 < 6

    t1 = t0 + timedelta(seconds=60)
    end_lease(lease_id=kept.pk, status="completed", cause="done", now=t1)
    deadline = t1 + timedelta(seconds=NOTICE)
    assert scheduled(cheap) == (deadline, higher.pk)
    assert scheduled(dearer) == (None, None)

    assert preempt_due_leases(now=deadline) == [cheap.pk]
    assert Order.objects.get(pk=higher.pk).status == "filled"
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0 and Order.objects.get(pk=lower.pk).status == "open"
    assert scheduled(dearer) == (None, None)  # its 2 GPUs alone make no gang of 6
    assert_no_gpu_twice()
    assert first_violation() is None


@pytest.mark.django_db
def test_cancelling_the_waiting_bid_calls_its_preemption_off_at_once():
    """The bid a preemption was scheduled for is cancelled: the victim's deadline is
    cleared at once (an event says why) and the lease is offered to the next resting bid
    that outbids it (found by the preemption pass in the same transaction)."""
    t0 = timezone.now() - timedelta(minutes=30)
    _provider, _node, _token, _ask, _high, (_low, low_lease) = full_node(t0)
    first, second = funded_buyer(100), funded_buyer(100)
    waiting = bid(first, 3_000_000).order
    low_lease.refresh_from_db()
    assert low_lease.preempted_for_id == waiting.pk and low_lease.preempt_at is not None
    later = bid(second, 2_400_000).order  # outbids 2.20 too, but the first came first
    low_lease.refresh_from_db()
    assert low_lease.preempted_for_id == waiting.pk

    book.cancel_order(user_id=first.pk, order_id=waiting.pk)

    low_lease.refresh_from_db()
    assert low_lease.preempted_for_id == later.pk and low_lease.preempt_at is not None
    causes = list(low_lease.events.values_list("cause", flat=True))
    assert any("preemption called off: the bid it was for is cancelled" in c for c in causes)
    assert first_violation() is None


@pytest.mark.django_db
def test_a_fully_leased_ask_can_be_withdrawn_and_its_gpus_stay_off_the_market():
    """Found by a user trial: an ask whose GPUs were all leased answered 'already filled'
    to its provider's cancel, then sold the GPUs again when the lease ended."""
    provider, node, _ = registered_node()
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=ASK, gpus=2, available_until=in_a_day()).order
    [lease] = bid(funded_buyer(100), 2_600_000, gpus=2).leases
    ask.refresh_from_db()
    assert ask.status == "filled"
    waiting = bid(funded_buyer(100), 2_600_000, gpus=2).order
    assert waiting.status == "open"

    withdrawn = book.cancel_order(user_id=provider.pk, order_id=ask.pk)
    assert withdrawn.status == "cancelled"
    lease.refresh_from_db()
    assert lease.status == "pending"  # the lease runs on
    mark_running(lease=lease, container_id="c" * 64)
    end_lease(lease_id=lease.pk, status="completed", cause="test")
    waiting.refresh_from_db()
    assert waiting.status == "open"  # the GPUs did not come back to the withdrawn ask
    assert Order.objects.get(pk=ask.pk).remaining_gpus == 0
    with pytest.raises(book.Conflict):
        book.cancel_order(user_id=provider.pk, order_id=ask.pk)
    filled_bid = Order.objects.filter(side="bid", status="filled").first()
    with pytest.raises(book.Conflict):  # a filled bid is done: nothing to withdraw
        book.cancel_order(user_id=filled_bid.owner_id, order_id=filled_bid.pk)
    assert first_violation() is None
