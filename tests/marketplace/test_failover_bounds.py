"""Failover's bounds and the buyer's word (marketplace/failover.py, lease_end, docs/FAULTS.md):
at most GPUMARKET_FAILOVER_MAX_CONTINUATIONS continuations per chain, a rested chain
names its bid and price (API story, `gpumarket wait`), and a buyer's stop of a failed
lease stops what its chain goes on as."""

from __future__ import annotations

import pytest

from buyer_cli.follow import chain_words
from marketplace import failover
from marketplace.lease_control import stop_lease
from marketplace.models import Lease, Order
from settlement.checks import first_violation
from settlement.models import Account, Hold
from tests.marketplace.test_failover import LIMIT, PRICE, _ask, _fail, _node, _running_lease_on_a
from tests.support.api import client_for

pytestmark = pytest.mark.django_db


def test_a_chain_fails_over_at_most_the_bound_then_the_hold_is_released(settings):
    settings.GPUMARKET_FAILOVER_MAX_CONTINUATIONS = 2
    buyer, _, _, lease, _ = _running_lease_on_a()
    for name in ("node-b", "node-c", "node-d"):
        provider, node = _node(name)
        _ask(provider, node, PRICE)
    current = lease
    for _ in range(2):  # two continuations: allowed
        failed = _fail(current, usage=0)
        assert failed.failover_state == "pending"
        assert failover.continue_lease(lease_id=failed.pk) == "continued"
        current = Lease.objects.get(continues=failed)
    failed = _fail(current, usage=0)  # the third failure: past the bound

    assert (failed.fault, failed.failover_state, failed.carry_hold_id) == ("provider",
                                                                           "released", None)
    assert Hold.objects.get(pk=failed.hold_id).status != "active"
    assert not Lease.objects.filter(continues=failed).exists()
    told = failed.events.order_by("-pk").first().cause
    assert told.startswith("not continued: the chain has failed over 2 times")
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance == 0
    body = client_for(buyer).get(f"/api/v1/leases/{failed.pk}/").json()
    assert "; not continued: the chain has failed over 2 times" in chain_words(body)
    assert failover.continue_lease(lease_id=failed.pk) == ""
    assert first_violation() is None


def test_a_rested_chain_tells_the_buyer_which_bid_holds_the_money():
    buyer, _, _, lease, _ = _running_lease_on_a()
    failed = _fail(lease)
    assert failover.continue_lease(lease_id=failed.pk) == "rested"
    rest = Order.objects.get(continues_lease_id=failed.pk)
    body = client_for(buyer).get(f"/api/v1/leases/{failed.pk}/").json()
    words = f"continues as bid {rest.pk}, resting at $2.500000/GPU-hour"
    assert words in body["chain"]["story"][0]
    assert chain_words(body) == f"; no ask at or below its price: {words}"  # what wait prints
    assert rest.price == LIMIT


def test_stopping_a_failed_lease_whose_bid_rests_cancels_the_bid_and_releases_its_hold():
    buyer, _, _, lease, _ = _running_lease_on_a()
    failed = _fail(lease)
    failover.continue_lease(lease_id=failed.pk)
    rest = Order.objects.get(continues_lease_id=failed.pk)
    assert rest.status == "open"

    stop_lease(buyer_id=buyer.pk, lease_id=failed.pk)

    rest.refresh_from_db()
    assert rest.status == "cancelled"
    assert Hold.objects.get(pk=rest.hold_id).status == "released"
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance == 0
    # a later ask at the limit fills nothing: the chain has stopped
    provider, node = _node("node-c")
    _ask(provider, node, LIMIT)
    assert not Lease.objects.filter(continues=failed).exists()
    assert first_violation() is None


def test_stopping_a_failed_lease_while_its_failover_is_pending_calls_it_off():
    buyer, _, _, lease, _ = _running_lease_on_a()
    provider, node = _node("node-b")
    _ask(provider, node, PRICE)
    failed = _fail(lease)
    carry = failed.carry_hold_id

    r = client_for(buyer).post(f"/api/v1/leases/{failed.pk}/stop/")
    assert r.status_code == 200, r.content

    failed.refresh_from_db()
    assert (failed.failover_state, failed.carry_hold_id) == ("released", None)
    assert Hold.objects.get(pk=carry).status == "released"
    assert failover.continue_lease(lease_id=failed.pk) == ""  # the queued task: nothing
    assert not Lease.objects.filter(continues=failed).exists()
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance == 0
    assert "not continued: stopped by the buyer" in r.json()["chain"]["story"][0]
    assert first_violation() is None


def test_stopping_a_failed_lease_stops_its_continuation():
    buyer, _, _, lease, _ = _running_lease_on_a()
    provider, node = _node("node-b")
    _ask(provider, node, PRICE)
    failed = _fail(lease)
    assert failover.continue_lease(lease_id=failed.pk) == "continued"
    made = Lease.objects.get(continues=failed)

    stop_lease(buyer_id=buyer.pk, lease_id=failed.pk)

    made.refresh_from_db()
    assert (made.status, made.cause) == ("cancelled", "stopped by the buyer")
    assert Account.objects.get(kind="buyer_held", owner=buyer).balance == 0
    assert first_violation() is None
