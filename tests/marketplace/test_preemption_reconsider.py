"""Preemption reconsidered (docs/MATCHING.md): leases that become preemptible after a bid
rests are offered at once to the resting bids that outbid them; on PostgreSQL, with
explicit `now=` instead of sleeping."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace import book, locking, preemption
from marketplace.lease_end import end_lease, preempt_due_leases
from marketplace.leases import mark_running
from marketplace.models import Lease, LeaseEvent, LeaseGpu, Order
from settlement.checks import first_violation
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
from tests.support.api import client_for

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

    # what it costs where it runs: four reads here, and it finds the lease (plus one read
    # of the told buyer's webhook endpoints: webhooks.emit of the preemption notice)
    with transaction.atomic():
        locking.lock_market(low_lease.market_id)
        with CaptureQueriesContext(connection) as queries:
            assert real(low_lease.market_id, t0) == [low_lease]
    reads = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    hooks = [r for r in reads if '"webhooks_webhookendpoint"' in r]
    assert len(reads) - len(hooks) == 4 and len(hooks) == 1
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
