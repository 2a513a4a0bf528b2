"""The marketplace's side of the lease contract (docs/LEASE_CONTRACT.md): a bid's stop terms
(notice_signal, stop_grace_seconds) travel to its lease and the runner payload; a
preemption puts `notice` in the payload (withdrawn when called off); the time after a
deadline is not billed. PostgreSQL, explicit `now=`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import book
from marketplace.lease_end import end_lease, preempt_due_leases
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from settlement.checks import first_violation
from settlement.money import lease_cost
from tests.factories import ask, ask_body, bid_body, funded_buyer, registered_node
from tests.marketplace.preemption_support import (  # noqa: F401  (notice_period: autouse)
    ASK,
    NOTICE,
    bid,
    full_node,
    notice_period,
)
from tests.support.api import assert_refused, client_for, runner_client, snapshot


def _payload(token: str, lease_id: int) -> dict:
    leases = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    return {le["id"]: le for le in leases}[lease_id]


@pytest.mark.django_db
def test_the_stop_terms_travel_from_the_bid_to_the_lease_and_its_runner():
    provider, node, token = registered_node()
    ask(provider, node, price=1_000_000, gpus=8)
    buyer = funded_buyer(100)
    answer = client_for(buyer).post("/api/v1/orders/", bid_body(
        price="2.00", gpus=1, notice_signal="SIGUSR1", stop_grace_seconds=45), format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["notice_signal"] == "SIGUSR1"
    assert answer.json()["stop_grace_seconds"] == 45
    [lease] = Lease.objects.filter(buyer=buyer)
    assert (lease.notice_signal, lease.stop_grace_seconds) == ("SIGUSR1", 45)
    item = _payload(token, lease.pk)
    assert item["notice_signal"] == "SIGUSR1" and item["stop_grace_seconds"] == 45
    assert item["notice"] is None  # no deadline it did not have
    shown = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/").json()
    assert shown["notice_signal"] == "SIGUSR1" and shown["stop_grace_seconds"] == 45


@pytest.mark.django_db
def test_a_bid_without_stop_terms_gets_the_defaults():
    provider, node, token = registered_node()
    ask(provider, node, price=1_000_000, gpus=8)
    buyer = funded_buyer(100)
    assert client_for(buyer).post("/api/v1/orders/", bid_body(price="2.00", gpus=1),
                                  format="json").status_code == 201
    [lease] = Lease.objects.filter(buyer=buyer)
    item = _payload(token, lease.pk)
    assert (item["notice_signal"], item["stop_grace_seconds"]) == ("", 10)


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), [
    ("notice_signal", "SIGKILL"), ("notice_signal", "USR1"), ("notice_signal", 10),
    ("stop_grace_seconds", 301), ("stop_grace_seconds", -1), ("stop_grace_seconds", "10"),
    ("stop_grace_seconds", 2.5), ("stop_grace_seconds", True),
])
def test_bad_stop_terms_are_refused_naming_the_field_and_nothing_is_written(field, value):
    provider, node, _token = registered_node()
    ask(provider, node, price=1_000_000, gpus=8)
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    answer = client_for(buyer).post("/api/v1/orders/", bid_body(price="2.00", **{field: value}),
                                    format="json")
    assert_refused(answer, field)
    assert snapshot(buyer) == before


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["notice_signal", "stop_grace_seconds"])
def test_an_ask_refuses_the_stop_terms(field):
    provider, node, _token = registered_node()
    value = "SIGUSR1" if field == "notice_signal" else 30
    answer = client_for(provider).post("/api/v1/orders/", ask_body(node, **{field: value}),
                                       format="json")
    assert_refused(answer, field, contains="for bids")
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_a_preemption_is_the_workload_s_notice_until_it_is_called_off():
    t0 = timezone.now() - timedelta(minutes=30)
    _p, _n, token, _ask, _high, (_low, low_lease) = full_node(t0)
    t1 = t0 + timedelta(seconds=600)
    placed = bid(funded_buyer(100), 3_000_000, now=t1)
    deadline = t1 + timedelta(seconds=NOTICE)
    notice = _payload(token, low_lease.pk)["notice"]
    assert notice == {"reason": "preemption", "deadline": deadline.isoformat(),
                      "since": t1.isoformat()}
    shown = client_for(low_lease.buyer).get(f"/api/v1/leases/{low_lease.pk}/").json()
    assert shown["notice"]["deadline"].replace("Z", "+00:00") == deadline.isoformat()

    # the bid is cancelled: the preemption is called off, and so is the notice
    book.cancel_order(user_id=placed.order.owner_id, order_id=placed.order.pk)
    low_lease.refresh_from_db()
    assert low_lease.preempt_at is None and low_lease.notice_deadline is None
    assert _payload(token, low_lease.pk)["notice"] is None


@pytest.mark.django_db
def test_the_time_after_a_deadline_is_not_billed():
    """The sweep (or a runner's report) may come after the deadline: the buyer pays up to
    the deadline only; the rest of the hold is released, the ledger balances."""
    t0 = timezone.now() - timedelta(minutes=30)
    _p, _n, _token, _ask, _high, (_low, low_lease) = full_node(t0)
    t1 = t0 + timedelta(seconds=600)
    bid(funded_buyer(100), 3_000_000, now=t1)
    deadline = t1 + timedelta(seconds=NOTICE)
    late = deadline + timedelta(seconds=7)
    assert preempt_due_leases(now=late) == [low_lease.pk]
    low_lease.refresh_from_db()
    assert low_lease.status == "preempted"
    assert low_lease.cost == lease_cost(ASK, 4, int((deadline - t0).total_seconds()))
    assert first_violation() is None


@pytest.mark.django_db
def test_a_stop_before_the_deadline_is_billed_to_the_stop():
    t0 = timezone.now() - timedelta(minutes=30)
    provider, node, _token = registered_node()
    ask(provider, node, price=ASK, gpus=8, now=t0)
    [lease] = bid(funded_buyer(100), ASK, gpus=8, interruptible=True, now=t0).leases
    mark_running(lease=lease, container_id="c" * 64, now=t0)
    bid(funded_buyer(1000), 3_000_000, gpus=8, now=t0 + timedelta(seconds=100))
    lease.refresh_from_db()
    assert lease.notice_deadline == t0 + timedelta(seconds=100 + NOTICE)
    stopped = t0 + timedelta(seconds=150)  # before the deadline: the stop's own time
    ended = end_lease(lease_id=lease.pk, status="cancelled", cause="stopped by the buyer",
                      now=stopped)
    assert ended.cost == lease_cost(ASK, 8, 150)
    assert first_violation() is None
