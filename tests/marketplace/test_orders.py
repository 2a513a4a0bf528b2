"""Continuous-auction orders: expiry, client order ids, IOC/FOK and the status filter,
through the services and the HTTP API, on PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta
from functools import partial

import pytest
from django.db import connections
from django.utils import timezone

from marketplace import book, tasks
from marketplace.errors import InvalidInput
from marketplace.models import Lease, Order
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Hold
from settlement.money import lease_cost
from tests import factories
from tests.factories import bid_body, ensure_catalog, funded_buyer, in_a_day, registered_node
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db

H100 = "h100-sxm-80gb"
ORDERS = "/api/v1/orders/"


_ask = partial(factories.ask, price=2_000_000, gpus=2)


# --------------------------------------------------------------------------- expiry


def test_past_expires_at_is_a_400_naming_it_and_writes_nothing():
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    past = (timezone.now() - timedelta(seconds=1)).isoformat()
    assert_refused(client_for(buyer).post(ORDERS, bid_body(expires_at=past), format="json"),
                   "expires_at", contains="future")
    assert_refused(client_for(buyer).post(ORDERS, bid_body(expires_at="tomorrow"), format="json"),
                   "expires_at")
    assert snapshot(buyer) == before
    with pytest.raises(InvalidInput) as e:
        book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=1_000_000, gpus=1,
                       duration_seconds=3600, expires_at=timezone.now())
    assert e.value.field == "expires_at"
    assert snapshot(buyer) == before


def test_expires_at_on_an_ask_is_refused():
    provider, node, _ = registered_node()
    body = {"side": "ask", "node": node.pk, "price": "2.00", "gpus": 2,
            "available_until": in_a_day().isoformat(), "expires_at": in_a_day().isoformat()}
    assert_refused(client_for(provider).post(ORDERS, body, format="json"), "expires_at")
    assert Order.objects.count() == 0


def test_the_sweep_expires_a_bid_releases_its_hold_and_records_why():
    buyer = funded_buyer(100)
    expires = timezone.now() + timedelta(minutes=10)
    r = client_for(buyer).post(ORDERS, bid_body(expires_at=expires.isoformat()), format="json")
    assert r.status_code == 201, r.json()
    order = Order.objects.get(pk=r.json()["id"])
    assert order.status == "open" and order.expires_at == expires
    assert ledger.wallet(user_id=buyer.pk).held == 5_000_000

    assert book.expire_orders(now=expires - timedelta(seconds=1)) == []
    assert book.expire_orders(now=expires) == [order.pk]
    order.refresh_from_db()
    assert order.status == "expired"
    event = order.events.order_by("pk").last()
    assert (event.from_status, event.to_status) == ("open", "expired")
    assert "expires_at" in event.cause and event.at == expires
    assert Hold.objects.get(pk=order.hold_id).status == "released"
    assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(100_000_000, 0, 0)
    # again: nothing to do; the beat task wraps the same service
    assert book.expire_orders(now=expires + timedelta(hours=1)) == []
    assert tasks.expire_orders() == []
    assert first_violation() is None


def test_a_bid_past_its_expiry_never_matches_even_before_the_sweep():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    now = timezone.now()
    bid = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_500_000, gpus=2,
                         duration_seconds=3600, expires_at=now + timedelta(seconds=30),
                         now=now).order
    # depth leaves it out as soon as it is due
    assert book.depth(bid.market) == ([(2_500_000, 2)], [])
    placed = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                            price=2_000_000, gpus=2, available_until=in_a_day(),
                            now=now + timedelta(seconds=31))
    assert placed.leases == [] and placed.order.status == "open"
    bid.refresh_from_db()
    assert bid.status == "expired"
    assert ledger.wallet(user_id=buyer.pk).held == 0
    assert first_violation() is None


def test_an_ask_past_available_until_expires_and_its_gpus_can_be_offered_again():
    provider, node, _ = registered_node()
    until = timezone.now() + timedelta(hours=2)
    ask = _ask(provider, node, gpus=8, until=until).order
    with pytest.raises(InvalidInput):
        _ask(provider, node, gpus=1)  # all 8 offered
    assert book.expire_orders(now=until) == [ask.pk]
    ask.refresh_from_db()
    assert ask.status == "expired"
    assert "available_until" in ask.events.order_by("pk").last().cause
    assert _ask(provider, node, gpus=8).order.status == "open"


# ------------------------------------------------------------------ client order id


def test_the_same_client_order_id_twice_returns_the_first_order_with_200():
    buyer, other = funded_buyer(100), funded_buyer(100)
    api = client_for(buyer)
    first = api.post(ORDERS, bid_body(client_order_id="run-42:a"), format="json")
    assert first.status_code == 201, first.json()
    assert first.json()["client_order_id"] == "run-42:a"
    before = snapshot(buyer)
    # a retry answers with the first order and writes nothing
    again = api.post(ORDERS, bid_body(client_order_id="run-42:a"), format="json")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["price"] == "2.500000"
    assert snapshot(buyer) == before
    # the same id with other terms is a mistake, not a retry: 409, nothing written
    other_terms = api.post(ORDERS, bid_body(client_order_id="run-42:a", price="3.00"),
                           format="json")
    assert other_terms.status_code == 409
    assert other_terms.json()["errors"]["client_order_id"] == [
        f"'run-42:a' was used for order {first.json()['id']} with another price: a replay "
        "must repeat its terms"]
    assert snapshot(buyer) == before
    # the id is per owner
    theirs = client_for(other).post(ORDERS, bid_body(client_order_id="run-42:a"), format="json")
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    assert Order.objects.count() == 2


@pytest.mark.parametrize("bad", ["", "a b", "x" * 65, "é", 42, None])
def test_bad_client_order_ids_are_refused(bad):
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    assert_refused(client_for(buyer).post(ORDERS, bid_body(client_order_id=bad), format="json"),
                   "client_order_id")
    assert snapshot(buyer) == before


def test_a_replayed_ask_returns_its_leases():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_500_000, gpus=2,
                   duration_seconds=3600)
    body = {"side": "ask", "node": node.pk, "price": "2.00", "gpus": 4,
            "available_until": in_a_day().isoformat(), "client_order_id": "ask-1"}
    first = client_for(provider).post(ORDERS, body, format="json")
    again = client_for(provider).post(ORDERS, body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["leases"] == again.json()["leases"] != []
    assert Order.objects.filter(side="ask").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_same_client_order_id_racing_makes_one_order():
    """8 threads post the same client order id at once: one order, one hold, and every
    caller gets that order back."""
    ensure_catalog()  # a transactional test starts from an empty database
    buyer = funded_buyer(100)
    start = threading.Barrier(8)
    results, errors = [], []

    def place():
        try:
            start.wait(timeout=30)
            results.append(book.place_bid(buyer_id=buyer.pk, market_slug=H100,
                                          price=2_000_000, gpus=1, duration_seconds=3600,
                                          client_order_id="same"))
        except Exception as exc:  # every failure is part of the outcome
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=place) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    order = Order.objects.get()
    assert {p.order.pk for p in results} == {order.pk}
    assert sorted(p.created for p in results) == [False] * 7 + [True]
    assert Hold.objects.count() == 1
    assert ledger.wallet(user_id=buyer.pk).held == 2_000_000
    assert first_violation() is None


# ------------------------------------------------------------------------ IOC / FOK


def test_fok_that_cannot_fill_whole_is_cancelled_with_nothing_held():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node, gpus=2)
    r = client_for(buyer).post(ORDERS, bid_body(gpus=4, gang_size=1, time_in_force="FOK"),
                               format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["status"] == "cancelled" and r.json()["leases"] == []
    order = Order.objects.get(pk=r.json()["id"])
    assert "FOK" in order.events.order_by("pk").last().cause
    assert Lease.objects.count() == 0
    assert ledger.wallet(user_id=buyer.pk).held == 0
    assert book.depth(order.market) == ([], [(2_000_000, 2)])  # the ask is untouched
    assert first_violation() is None


def test_fok_that_can_fill_whole_fills():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node, gpus=4)
    r = client_for(buyer).post(ORDERS, bid_body(gpus=4, time_in_force="FOK"), format="json")
    assert r.json()["status"] == "filled" and len(r.json()["leases"]) == 1
    assert ledger.wallet(user_id=buyer.pk).held == lease_cost(2_000_000, 4, 3600)


def test_ioc_fills_what_it_can_and_never_rests():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    ask = _ask(provider, node, gpus=2).order
    r = client_for(buyer).post(ORDERS, bid_body(gpus=4, gang_size=1, time_in_force="IOC"),
                               format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["status"] == "cancelled" and body["remaining_gpus"] == 2
    [lease] = Lease.objects.filter(pk__in=body["leases"])
    assert lease.gpu_count == 2 and lease.price == 2_000_000
    order = Order.objects.get(pk=body["id"])
    causes = [e.cause for e in order.events.order_by("pk")]
    assert causes[-1] == "IOC: remainder not rested"
    assert book.depth(order.market) == ([], [])  # nothing rests on either side
    ask.refresh_from_db()
    assert ask.status == "filled"
    # only the lease's cost stays held; the unfilled half of the bid is released
    assert ledger.wallet(user_id=buyer.pk).held == lease_cost(2_000_000, 2, 3600)
    assert first_violation() is None


def test_ioc_with_nothing_to_match_is_cancelled():
    buyer = funded_buyer(100)
    r = client_for(buyer).post(ORDERS, bid_body(time_in_force="IOC"), format="json")
    assert r.json()["status"] == "cancelled" and r.json()["leases"] == []
    assert ledger.wallet(user_id=buyer.pk).held == 0


# -------------------------------------------------------------------- status filter


def test_orders_filter_by_status_and_side():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _ask(provider, node, gpus=2)
    api = client_for(buyer)
    filled = api.post(ORDERS, bid_body(), format="json").json()["id"]
    resting = api.post(ORDERS, bid_body(), format="json").json()["id"]
    cancelled = api.post(ORDERS, bid_body(time_in_force="IOC"), format="json").json()["id"]

    def ids(query):
        r = api.get(ORDERS + query)
        assert r.status_code == 200, r.json()
        return [o["id"] for o in r.json()["results"]]

    assert ids("") == [cancelled, resting, filled]
    assert ids("?status=open") == [resting]
    assert ids("?status=filled") == [filled]
    assert ids("?status=open,cancelled") == [cancelled, resting]
    assert ids("?status=expired") == []
    assert ids("?side=bid&status=filled") == [filled]
    assert ids("?side=ask") == []  # the ask is the provider's
    assert client_for(provider).get(ORDERS + "?side=ask").json()["results"] != []
    assert_refused(api.get(ORDERS + "?status=nope"), "status")
    assert_refused(api.get(ORDERS + "?status="), "status")
    assert_refused(api.get(ORDERS + "?side=both"), "side")
