"""Maintenance windows (marketplace/maintenance.py, docs/LEASE_CONTRACT.md): announced and
withdrawn through the API, refused when bad with nothing written; asks sell no time that
overlaps a window; leases that would overlap get their notice at the start minus the
notice period and end at the start, charged up to it; buyers see the window on the
market's offers. PostgreSQL, explicit `now=`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from marketplace import book, lease_control, maintenance
from marketplace.errors import Conflict
from marketplace.lease_notice import end_noticed_leases
from marketplace.leases import mark_running
from marketplace.models import Lease
from providers.models import MaintenanceWindow
from settlement.checks import first_violation
from settlement.money import lease_cost
from tests.factories import H100, ask, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client

NOTICE = 120
PRICE = 2_000_000


@pytest.fixture(autouse=True)
def notice_period(settings):
    settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS = NOTICE


def _url(node, window=None) -> str:
    return f"/api/v1/nodes/{node.pk}/maintenance/" + (f"{window}/" if window else "")


def _body(start, hours=2, **changes):
    return {"starts_at": start.isoformat(),
            "ends_at": (start + timedelta(hours=hours)).isoformat(), **changes}


@pytest.mark.django_db
def test_a_provider_announces_lists_and_withdraws_a_window():
    provider, node, _token = registered_node()
    api = client_for(provider)
    start = timezone.now() + timedelta(hours=3)
    made = api.post(_url(node), _body(start, reason="PSU swap"), format="json")
    assert made.status_code == 201, made.content
    window = made.json()
    assert window["node"] == node.pk and window["reason"] == "PSU swap"
    node.refresh_from_db()
    assert node.maintenance_from == start
    listed = api.get(_url(node)).json()
    assert listed["node"] == node.pk and [w["id"] for w in listed["windows"]] == [window["id"]]

    stranger = client_for(registered_node(name="other", own_uuids=True)[0])
    assert stranger.get(_url(node)).status_code == 404
    assert stranger.delete(_url(node, window["id"])).status_code == 404

    assert api.delete(_url(node, window["id"])).status_code == 204
    assert not MaintenanceWindow.objects.exists()
    node.refresh_from_db()
    assert node.maintenance_from is None


@pytest.mark.django_db
@pytest.mark.parametrize(("case", "field"), [
    ("past", "starts_at"), ("inside the notice period", "starts_at"),
    ("ends before it starts", "ends_at"), ("ends as it starts", "ends_at"),
    ("overlaps", "starts_at"), ("too long", "ends_at"), ("unknown field", "colour"),
    ("not a time", "starts_at"),
])
def test_a_bad_window_is_refused_naming_the_field_and_nothing_is_written(case, field):
    provider, node, _token = registered_node()
    api = client_for(provider)
    now = timezone.now()
    first = now + timedelta(hours=5)
    assert api.post(_url(node), _body(first), format="json").status_code == 201
    body = {
        "past": _body(now - timedelta(hours=1)),
        "inside the notice period": _body(now + timedelta(seconds=NOTICE // 2)),
        "ends before it starts": _body(now + timedelta(hours=1), hours=-1),
        "ends as it starts": _body(now + timedelta(hours=1), hours=0),
        "overlaps": _body(first + timedelta(hours=1)),
        "too long": _body(now + timedelta(hours=1), hours=32 * 24),
        "unknown field": _body(now + timedelta(hours=1), colour="red"),
        "not a time": {"starts_at": "tomorrow", "ends_at": first.isoformat()},
    }[case]
    answer = api.post(_url(node), body, format="json")
    assert_refused(answer, field)
    assert MaintenanceWindow.objects.count() == 1
    node.refresh_from_db()
    assert node.maintenance_from == first


@pytest.mark.django_db
def test_asks_sell_no_time_that_overlaps_a_window_and_sell_again_after_it():
    t0 = timezone.now() - timedelta(hours=6)
    provider, node, _token = registered_node()
    ask(provider, node, price=PRICE, gpus=8, until=t0 + timedelta(days=2), now=t0)
    start = t0 + timedelta(hours=2)
    maintenance.announce(user_id=provider.pk, node_id=node.pk, starts_at=start,
                         ends_at=start + timedelta(hours=1), now=t0)
    buyer = funded_buyer(1000)
    long_bid = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                              duration_seconds=3 * 3600, now=t0)
    assert long_bid.leases == []  # 3 h from t0 would run into the window: it rests
    short = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                           duration_seconds=3600, now=t0)
    assert len(short.leases) == 1  # 1 h ends before the window: sold

    # the window is over (real time is t0 + 6 h): the sweep reopens the node's asks
    assert maintenance.reopen_after_windows() == [node.pk]
    node.refresh_from_db()
    assert node.maintenance_from is None
    again = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                           duration_seconds=3 * 3600)
    assert len(again.leases) == 1


@pytest.mark.django_db
def test_leases_that_would_overlap_are_noticed_then_ended_at_the_start():
    t0 = timezone.now() - timedelta(hours=1)
    provider, node, token = registered_node()
    ask(provider, node, price=PRICE, gpus=8, now=t0)
    buyer = funded_buyer(1000)
    [long_lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=2,
                                  duration_seconds=4 * 3600, now=t0).leases
    [short_lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=2,
                                   duration_seconds=1200, now=t0).leases
    for lease in (long_lease, short_lease):
        mark_running(lease=lease, container_id="c" * 64, now=t0)
    start = t0 + timedelta(hours=2)
    maintenance.announce(user_id=provider.pk, node_id=node.pk, starts_at=start,
                         ends_at=start + timedelta(hours=1), reason="kernel update", now=t0)

    told_at = start - timedelta(seconds=NOTICE)
    assert maintenance.give_due_notices(now=told_at - timedelta(seconds=1)) == []
    assert maintenance.give_due_notices(now=told_at) == [long_lease.pk]  # not the short one
    assert maintenance.give_due_notices(now=told_at + timedelta(seconds=5)) == []  # once
    [item] = [le for le in runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
              if le["id"] == long_lease.pk]
    assert item["notice"] == {"reason": "maintenance", "deadline": start.isoformat(),
                              "since": told_at.isoformat()}
    shown = client_for(buyer).get(f"/api/v1/leases/{long_lease.pk}/").json()
    assert any("maintenance" in e["cause"] and "kernel update" in e["cause"]
               for e in shown["events"])

    assert end_noticed_leases(now=start - timedelta(seconds=1)) == []
    assert end_noticed_leases(now=start + timedelta(seconds=4)) == [long_lease.pk]
    long_lease.refresh_from_db()
    assert long_lease.status == "preempted" and "maintenance" in long_lease.cause
    # charged up to the window's start, not to when the sweep came
    assert long_lease.cost == lease_cost(PRICE, 2, int((start - t0).total_seconds()))
    assert end_noticed_leases(now=start + timedelta(seconds=9)) == []
    assert first_violation() is None


@pytest.mark.django_db
def test_a_withdrawn_window_takes_its_notice_back_and_extensions_stop_at_a_window():
    t0 = timezone.now() - timedelta(minutes=10)
    provider, node, token = registered_node()
    ask(provider, node, price=PRICE, gpus=8, now=t0)
    buyer = funded_buyer(1000)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=PRICE, gpus=1,
                             duration_seconds=3600, now=t0).leases
    lease = mark_running(lease=lease, container_id="c" * 64, now=t0)
    start = timezone.now() + timedelta(seconds=NOTICE + 60)
    window = maintenance.announce(user_id=provider.pk, node_id=node.pk, starts_at=start,
                                  ends_at=start + timedelta(hours=1))
    with pytest.raises(Conflict, match="maintenance"):  # the extension would overlap it
        lease_control.extend_lease(buyer_id=buyer.pk, lease_id=lease.pk, seconds=3600)
    assert maintenance.give_due_notices(now=start - timedelta(seconds=NOTICE)) == [lease.pk]
    maintenance.withdraw(user_id=provider.pk, node_id=node.pk, window_id=window.pk)
    lease.refresh_from_db()
    assert lease.notice_deadline is None and lease.status == "running"
    [item] = [le for le in runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
              if le["id"] == lease.pk]
    assert item["notice"] is None
    assert end_noticed_leases(now=start + timedelta(seconds=1)) == []
    assert Lease.objects.get(pk=lease.pk).status == "running"


@pytest.mark.django_db
def test_buyers_see_the_window_on_the_market_offers():
    provider, node, _token = registered_node()
    ask(provider, node, price=PRICE, gpus=8)
    start = timezone.now() + timedelta(hours=3)
    maintenance.announce(user_id=provider.pk, node_id=node.pk, starts_at=start,
                         ends_at=start + timedelta(hours=2))
    offers = client_for(funded_buyer(10)).get(f"/api/v1/gpu-classes/{H100}/").json()["offers"]
    [offer] = offers
    [window] = offer["maintenance"]
    assert window["starts_at"].replace("Z", "+00:00") == start.isoformat()
    page = Client().get(f"/markets/{H100}/")  # the market page, anonymous
    assert page.status_code == 200
    assert start.strftime("%Y-%m-%d %H:%M") in page.content.decode()


@pytest.mark.django_db
def test_the_earliest_deadline_is_the_notice_and_a_withdrawn_window_gives_the_other_back():
    from tests.marketplace.preemption_support import full_node

    t0 = timezone.now() - timedelta(minutes=30)
    provider, node, _token, _ask, _high, (_low, lease) = full_node(t0)
    t1 = t0 + timedelta(seconds=600)
    book.place_bid(buyer_id=funded_buyer(100).pk, market_slug=H100, price=3_000_000, gpus=4,
                   duration_seconds=3600, now=t1)
    lease.refresh_from_db()
    preempt_at = lease.preempt_at
    assert (lease.notice_reason, lease.notice_deadline) == ("preemption", preempt_at)
    start = preempt_at - timedelta(seconds=10)  # maintenance comes first
    window = maintenance.announce(user_id=provider.pk, node_id=node.pk, starts_at=start,
                                  ends_at=start + timedelta(hours=1),
                                  now=start - timedelta(seconds=NOTICE))
    assert lease.pk in maintenance.give_due_notices(now=t1 + timedelta(seconds=1))
    lease.refresh_from_db()
    assert (lease.notice_reason, lease.notice_deadline) == ("maintenance", start)
    maintenance.withdraw(user_id=provider.pk, node_id=node.pk, window_id=window.pk,
                         now=t1 + timedelta(seconds=2))
    lease.refresh_from_db()
    assert (lease.notice_reason, lease.notice_deadline) == ("preemption", preempt_at)
