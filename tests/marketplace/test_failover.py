"""Failover and the provider's credit (marketplace/failover.py, lease_end, docs/FAULTS.md):
a lease failed by a provider-side cause continues on another node at or below its price
with the hold moved, once; else rests as a GTC bid or gives the hold back; the provider
pays the buyer a bounded credit with the evidence; a buyer-caused failure costs nothing."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import book, failover
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Account, Hold, JournalEntry
from settlement.money import lease_cost
from tests.factories import H100, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_400_000  # the failed lease's price (ask A's)
LIMIT = 2_500_000  # the buyer's bid limit
XID79 = ("GPU {uuid}: xid: XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (GPU has fallen "
         "off the bus), NVIDIA immediate action RESTART_BM")


def _node(name):
    provider, node, _token = registered_node(name=name, own_uuids=True)
    return provider, node


def _ask(provider, node, price):
    return book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                          price=price, gpus=8, available_until=in_a_day()).order


def _running_lease_on_a(**bid_terms):
    """A buyer's 1-GPU, 1-hour lease on node A (ask at PRICE), running for 600 s."""
    prov_a, node_a = _node("node-a")
    _ask(prov_a, node_a, PRICE)
    buyer = funded_buyer(100)
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=LIMIT, gpus=1,
                            duration_seconds=3600, **bid_terms)
    [lease] = placed.leases
    now = timezone.now()
    lease = mark_running(lease=lease, container_id="c" * 64, now=now - timedelta(seconds=600))
    return buyer, prov_a, node_a, lease, placed.order


def _fail(lease, cause=None, usage=600):
    uuid = lease.lease_gpus.first().gpu.uuid
    return end_lease(lease_id=lease.pk, status="failed",
                     cause=cause or XID79.format(uuid=uuid),
                     detail={"runner_usage_seconds": usage})


def test_an_xid_79_continues_on_another_node_with_the_hold_moved_and_the_credit_paid(settings):
    settings.GPUMARKET_FAULT_CREDIT_MINUTES = 5
    buyer, _prov_a, _node_a, lease, _ = _running_lease_on_a()
    prov_b, node_b = _node("node-b")
    ask_b = _ask(prov_b, node_b, 2_300_000)
    prov_c, node_c = _node("node-c")
    _ask(prov_c, node_c, 2_450_000)  # above the lease's price: never taken
    held_before = Account.objects.get(kind="buyer_held", owner=buyer).balance

    failed = _fail(lease)

    assert (failed.status, failed.fault, failed.failure_code) == ("failed", "provider", "gpu_xid")
    assert failed.cost == lease_cost(PRICE, 1, 600)
    # the provider pays the cost of the last 5 healthy minutes, from its earnings
    assert failed.fault_credit == lease_cost(PRICE, 1, 300)
    entry = JournalEntry.objects.get(kind="fault_credit", reference=f"lease:{failed.pk}")
    assert "XID 79" in entry.evidence and entry.evidence.startswith(f"lease {failed.pk} on node")
    assert failed.failover_state == "pending"
    carry = Hold.objects.get(pk=failed.carry_hold_id)
    assert carry.status == "active" and carry.amount == lease_cost(PRICE, 1, 3600) - failed.cost
    assert first_violation() is None  # the carry hold is accounted for while pending

    assert failover.continue_lease(lease_id=failed.pk) == "continued"

    failed.refresh_from_db()
    made = failed.continuation
    assert (made.node_id, made.price, made.duration_seconds) == (node_b.pk, 2_300_000, 3000)
    assert (made.chain_id, made.chain, made.continues_id) == (failed.pk, failed.pk, failed.pk)
    assert made.ask_id == ask_b.pk and made.failover is True
    assert made.hold_id == carry.pk  # the same hold, moved, cut to the new cost
    carry.refresh_from_db()
    assert carry.amount == lease_cost(2_300_000, 1, 3000)
    assert carry.reference == f"lease:{made.pk}"
    assert (failed.failover_state, failed.carry_hold_id) == ("continued", None)
    # the buyer's money: the healthy seconds charged, the continuation held, the rest back
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance \
        == held_before - lease_cost(PRICE, 1, 3600) + carry.amount
    ask_b.refresh_from_db()
    assert ask_b.remaining_gpus == 7
    story = failed.events.order_by("-pk").first().cause
    assert story.startswith(f"lease {failed.pk} failed on node node-a (")
    assert f"continued as lease {made.pk} on node node-b at" in story
    assert first_violation() is None

    # once: a retried or duplicated task finds nothing pending
    assert failover.continue_lease(lease_id=failed.pk) == ""
    assert Lease.objects.filter(continues=failed).count() == 1


def test_without_an_ask_at_or_below_the_price_the_remaining_time_rests_as_a_gtc_bid():
    _buyer, _prov_a, _node_a, lease, _bid = _running_lease_on_a()
    prov_b, node_b = _node("node-b")
    _ask(prov_b, node_b, 2_600_000)  # above the buyer's limit too
    failed = _fail(lease)

    assert failover.continue_lease(lease_id=failed.pk) == "rested"

    failed.refresh_from_db()
    rest = Order.objects.get(continues_lease_id=failed.pk)
    assert (rest.side, rest.time_in_force, rest.price, rest.gpus, rest.duration_seconds) \
        == ("bid", "GTC", LIMIT, 1, 3000)
    assert rest.status == "open" and failed.failover_state == "rested"
    assert Hold.objects.get(pk=rest.hold_id).amount == lease_cost(LIMIT, 1, 3000)
    told = failed.events.order_by("-pk").first().cause
    assert f"continues as bid {rest.pk}, resting at $2.500000/GPU-hour" in told
    assert first_violation() is None

    # capacity at the limit later: the bid fills and its lease joins the chain
    prov_c, node_c = _node("node-c")
    _ask(prov_c, node_c, 2_500_000)
    made = Lease.objects.get(continues=failed)
    assert (made.node_id, made.chain_id, made.duration_seconds) == (node_c.pk, failed.pk, 3000)
    assert first_violation() is None


def test_an_ioc_bid_s_remaining_time_is_released_when_nothing_is_at_or_below_the_price():
    buyer, _, _, lease, _ = _running_lease_on_a(time_in_force="IOC")
    failed = _fail(lease)
    available = Account.objects.get(kind="buyer_available", owner=buyer).balance
    carried = Hold.objects.get(pk=failed.carry_hold_id).amount

    assert failover.continue_lease(lease_id=failed.pk) == "released"

    failed.refresh_from_db()
    assert failed.failover_state == "released" and not Lease.objects.filter(continues=failed)
    assert Account.objects.get(kind="buyer_available", owner=buyer).balance \
        == available + carried
    assert "not continued" in failed.events.order_by("-pk").first().cause
    assert first_violation() is None


def test_the_failed_node_is_never_a_candidate():
    _buyer, _prov_a, _node_a, lease, _ = _running_lease_on_a(time_in_force="IOC")
    # node A's ask still has 7 free GPUs at the price: not used
    failed = _fail(lease)
    assert failover.continue_lease(lease_id=failed.pk) == "released"


def test_a_workload_s_own_exit_costs_the_provider_nothing_and_does_not_fail_over():
    _buyer, _prov_a, _, lease, _ = _running_lease_on_a()
    prov_b, node_b = _node("node-b")
    _ask(prov_b, node_b, 2_000_000)
    failed = _fail(lease, cause="container exited with status 1")

    assert (failed.fault, failed.failure_code, failed.fault_credit) == ("buyer",
                                                                        "workload_exit", 0)
    assert failed.failover_state == "" and failed.carry_hold_id is None
    assert not JournalEntry.objects.filter(kind="fault_credit").exists()
    assert Hold.objects.get(pk=failed.hold_id).status == "captured"
    assert failover.continue_lease(lease_id=failed.pk) == ""
    assert first_violation() is None


def test_an_interruptible_bid_gets_the_credit_but_no_failover_by_default():
    _buyer, _prov_a, _, lease, bid = _running_lease_on_a(interruptible=True)
    assert bid.failover is False and lease.failover is False
    failed = _fail(lease)
    assert failed.fault == "provider" and failed.fault_credit > 0
    assert failed.failover_state == "" and failed.carry_hold_id is None
    assert first_violation() is None


def test_the_credit_is_bounded_by_what_the_lease_earned_the_provider(settings):
    settings.GPUMARKET_FAULT_CREDIT_MINUTES = 60
    _buyer, prov_a, _, lease, _ = _running_lease_on_a(failover=False)
    failed = _fail(lease)
    assert failed.fault_credit == failed.provider_amount  # not the 60 minutes' cost
    assert Account.objects.get(kind="provider_earned", owner=prov_a).balance == 0
    assert first_violation() is None


def test_a_never_started_lease_continues_with_its_whole_time():
    prov_a, node_a = _node("node-a")
    _ask(prov_a, node_a, PRICE)
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=LIMIT, gpus=1,
                             duration_seconds=3600).leases
    prov_b, node_b = _node("node-b")
    _ask(prov_b, node_b, PRICE)
    failed = end_lease(lease_id=lease.pk, status="failed",
                       cause=f"node node-a missed heartbeats since {timezone.now().isoformat()}")
    assert failed.failure_code == "node_silent" and failed.fault_credit == 0  # nothing earned
    assert failover.continue_lease(lease_id=failed.pk) == "continued"
    assert Lease.objects.get(continues=failed).duration_seconds == 3600
    assert first_violation() is None


def test_min_reliability_keeps_the_continuation_off_unreliable_nodes():
    _buyer, _prov_a, _node_a, lease, _ = _running_lease_on_a(min_reliability=Decimal("0.9"),
                                                          time_in_force="IOC")
    prov_b, node_b = _node("node-b")
    _ask(prov_b, node_b, 2_000_000)
    # node B's record: one provider-caused failure, no completion → reliability 0
    other = funded_buyer(100)
    [on_b] = book.place_bid(buyer_id=other.pk, market_slug=H100, price=2_000_000, gpus=1,
                            duration_seconds=3600, failover=False).leases
    assert on_b.node_id == node_b.pk
    end_lease(lease_id=on_b.pk, status="failed", cause="the lease's container is gone")
    failed = _fail(lease)
    assert failover.continue_lease(lease_id=failed.pk) == "released"


def test_the_api_shows_the_chain_and_refuses_a_bad_min_reliability():
    buyer, _prov_a, _node_a, lease, _ = _running_lease_on_a()
    prov_b, node_b = _node("node-b")
    _ask(prov_b, node_b, 2_000_000)
    failed = _fail(lease)
    failover.continue_lease(lease_id=failed.pk)
    made = Lease.objects.get(continues=failed)
    client = APIClient()
    client.force_authenticate(buyer)
    body = client.get(f"/api/v1/leases/{made.pk}/").json()
    assert body["chain_id"] == failed.pk and body["continues"] == failed.pk
    assert [x["id"] for x in body["chain"]["leases"]] == [failed.pk, made.pk]
    [line] = body["chain"]["story"]
    assert line.startswith(f"lease {failed.pk} failed on node node-a (GPU ")
    assert "XID 79, GPU has fallen off the bus" in line
    assert f"continued as lease {made.pk} on node node-b" in line
    seller = APIClient()
    seller.force_authenticate(prov_b)  # another provider's node names are the buyer's only
    assert seller.get(f"/api/v1/leases/{made.pk}/").json()["chain"] is None
    old = client.get(f"/api/v1/leases/{failed.pk}/").json()
    assert (old["fault"], old["failure_code"], old["failover_state"]) == (
        "provider", "gpu_xid", "continued")
    assert Decimal(old["fault_credit"]) * 1_000_000 == failed.fault_credit > 0

    for bad in ("1.5", "-0.1", "x"):
        r = client.post("/api/v1/orders/", {"side": "bid", "gpu_class": H100, "price": "2.5",
                                            "gpus": 1, "hours": 1, "min_reliability": bad},
                        format="json")
        assert r.status_code == 400 and set(r.json()["errors"]) == {"min_reliability"}
    r = client.post("/api/v1/orders/", {"side": "bid", "gpu_class": H100, "price": "1.0",
                                        "gpus": 1, "hours": 1, "min_reliability": "0.95",
                                        "interruptible": True}, format="json")
    assert r.status_code == 201, r.json()
    assert (r.json()["min_reliability"], r.json()["failover"]) == ("0.950", False)


def test_fault_credit_is_written_once_per_lease():
    from settlement.credits import fault_credit

    provider, buyer = funded_buyer(1), funded_buyer(1)
    ledger.dev_credit(user_id=provider.pk, amount=1)  # (a wallet, not earnings)
    assert fault_credit(provider_id=provider.pk, buyer_id=buyer.pk, amount=10, bound=10,
                        reference="lease:1", evidence="x") == 0  # nothing earned: nothing
    assert not JournalEntry.objects.filter(kind="fault_credit").exists()
    with pytest.raises(ValueError):
        fault_credit(provider_id=provider.pk, buyer_id=buyer.pk, amount=-1, bound=10,
                     reference="lease:1", evidence="x")
