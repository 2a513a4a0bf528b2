"""The buyer's stop and extend (POST /api/v1/leases/<id>/stop/ and /extend/): a stop in
each state pays exactly the seconds used, split 85/15, releases the rest and re-matches the
GPUs; an extension holds the extra cost on a new hold, and the lease settles across both;
refusals name why and write nothing. Continuous-auction and sealed-bid leases alike."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import auctions, book, lease_control, leases
from marketplace.lease_end import end_lease
from marketplace.models import Lease, LeaseEvent, LeaseExtension, Order
from settlement import services as ledger
from settlement.models import Hold, JournalEntry
from settlement.money import lease_cost
from settlement.split import split
from tests.factories import RTX4090_DUMP, ask, bid, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db
PRICE = 2_490_000  # micro-USD per GPU-hour, the ask's (the trade price)


def _lease(*, gpus: int = 1, duration_seconds: int = 3600, ask_gpus: int = 8, until=None,
           usd: int = 100, **terms):
    """A provider's ask and a buyer's bid that fills it: (buyer, lease, node, token)."""
    provider, node, token = registered_node()
    ask(provider, node, price=PRICE, gpus=ask_gpus, until=until)
    buyer = funded_buyer(usd)
    [lease] = bid(buyer, price=PRICE, gpus=gpus, duration_seconds=duration_seconds,
                  **terms).leases
    return buyer, lease, node, token


def _run(lease, *, ago: int) -> Lease:
    """The runner's `running`, `ago` seconds back."""
    return leases.mark_running(lease=lease, container_id="c" * 64,
                               now=timezone.now() - timedelta(seconds=ago))


def _stop(user, lease_id):
    return client_for(user).post(f"/api/v1/leases/{lease_id}/stop/", format="json")


def _extend(user, lease_id, body):
    return client_for(user).post(f"/api/v1/leases/{lease_id}/extend/", body, format="json")


def _assert_settled_exactly(lease: Lease, seconds: int) -> None:
    cost = lease_cost(lease.price, lease.gpu_count, seconds)
    parts = split(cost, 1500)
    assert (lease.cost, lease.platform_fee, lease.provider_amount) == \
        (cost, parts.platform_fee, parts.provider)
    assert lease.provider_amount + lease.platform_fee == lease.cost


@pytest.mark.parametrize("state", ["pending", "starting"])
def test_stopping_a_lease_that_never_ran_charges_nothing(state):
    buyer, lease, _, _ = _lease()
    if state == "starting":
        leases.mark_starting(lease=lease)
    r = _stop(buyer, lease.pk)
    assert r.status_code == 200, r.content
    assert r.json()["status"] == "cancelled" and r.json()["cost"] == "0.000000"
    assert r.json()["cause"] == "stopped by the buyer"
    assert Hold.objects.get(pk=lease.hold_id).status == "captured"
    assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(available=100_000_000, held=0,
                                                            earned=0)
    assert LeaseEvent.objects.filter(lease=lease, to_status="cancelled",
                                     cause="stopped by the buyer").count() == 1


def test_stopping_a_running_lease_pays_the_seconds_used_exactly():
    buyer, lease, _, _ = _lease(gpus=2)
    _run(lease, ago=600)
    r = _stop(buyer, lease.pk)
    assert r.status_code == 200, r.content
    ended = Lease.objects.get(pk=lease.pk)
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    assert 600 <= seconds < 700
    _assert_settled_exactly(ended, seconds)
    body = r.json()
    assert body["status"] == "cancelled" and body["cost"] == f"{ended.cost / 1e6:.6f}"
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - ended.cost
    assert ledger.wallet(user_id=buyer.pk).held == 0


def test_a_second_stop_and_a_stop_of_an_ended_lease_answer_the_lease_unchanged():
    buyer, lease, _, _ = _lease()
    _run(lease, ago=60)
    first = _stop(buyer, lease.pk)
    entries = JournalEntry.objects.count()
    again = _stop(buyer, lease.pk)
    assert again.status_code == 200 and again.json() == first.json()
    assert JournalEntry.objects.count() == entries

    [done] = bid(funded_buyer(10), price=PRICE).leases  # ended by the runner: answered as is
    leases.mark_running(lease=done, container_id="d" * 64)
    end_lease(lease_id=done.pk, status="completed", cause="the runner's report")
    r = _stop(done.buyer, done.pk)
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert r.json()["cause"] == "the runner's report"


def test_another_buyers_lease_is_404_like_a_missing_one_and_changes_nothing():
    buyer, lease, _, _ = _lease()
    stranger = funded_buyer(10)
    before = snapshot(buyer, stranger)
    for path in ("stop", "extend"):
        theirs = client_for(stranger).post(f"/api/v1/leases/{lease.pk}/{path}/",
                                           {"hours": 1}, format="json")
        missing = client_for(stranger).post(f"/api/v1/leases/{lease.pk + 999}/{path}/",
                                            {"hours": 1}, format="json")
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["detail"].replace(str(lease.pk), "N") == \
            missing.json()["detail"].replace(str(lease.pk + 999), "N")
    provider = Lease.objects.get(pk=lease.pk).provider  # its provider is no buyer either
    assert _stop(provider, lease.pk).status_code == 404
    assert snapshot(buyer, stranger) == before
    assert Lease.objects.get(pk=lease.pk).status == "pending"


def test_the_stopped_gpus_return_to_the_ask_and_a_resting_bid_takes_them():
    buyer, lease, _, _ = _lease(ask_gpus=1)
    waiting = funded_buyer(100)
    rest = bid(waiting, price=PRICE, gpus=1)
    assert rest.order.status == "open" and not rest.leases
    _run(lease, ago=30)
    assert _stop(buyer, lease.pk).status_code == 200
    taken = Lease.objects.get(buyer=waiting)
    assert taken.status == "pending" and taken.ask_id == lease.ask_id
    assert [g.gpu_id for g in taken.lease_gpus.all()] == \
        [g.gpu_id for g in lease.lease_gpus.all()]
    assert Order.objects.get(pk=rest.order.pk).status == "filled"


def test_extend_holds_the_extra_on_a_new_hold_and_the_lease_settles_across_both(settings):
    buyer, lease, _, token = _lease(gpus=2, duration_seconds=1800)
    running = _run(lease, ago=1700)
    holds = Hold.objects.count()
    r = _extend(buyer, lease.pk, {"hours": 1})
    assert r.status_code == 200, r.content
    extra = lease_cost(PRICE, 2, 1800 + 3600) - lease_cost(PRICE, 2, 1800)
    assert Hold.objects.count() == holds + 1
    [ext] = LeaseExtension.objects.filter(lease=lease)
    assert (ext.seconds, ext.cost, Hold.objects.get(pk=ext.hold_id).amount) == \
        (3600, extra, extra)
    assert r.json()["duration_seconds"] == 5400
    extended = Lease.objects.get(pk=lease.pk)
    assert extended.ends_at == running.ends_at + timedelta(hours=1)
    assert ledger.wallet(user_id=buyer.pk).held == lease_cost(PRICE, 2, 5400)
    assert "extended by the buyer by 3600 s" in extended.events.last().cause
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["ends_at"] == extended.ends_at.isoformat()
    assert listed["duration_seconds"] == 5400 and listed["stop_requested"] is False

    # past the original 30 minutes: metering draws on both holds, then the stop settles
    settings.GPUMARKET_METER_INTERVAL_SECONDS = 600
    start = running.started_at
    assert leases.meter_lease(lease_id=lease.pk, now=start + timedelta(seconds=2450)) \
        == lease_cost(PRICE, 2, 2400)
    assert Hold.objects.get(pk=ext.hold_id).captured == lease_cost(PRICE, 2, 2400) \
        - lease_cost(PRICE, 2, 1800)
    lease_control.stop_lease(buyer_id=buyer.pk, lease_id=lease.pk,
                             now=start + timedelta(seconds=2500))
    ended = Lease.objects.get(pk=lease.pk)
    seconds = 2500
    assert ended.cost == lease_cost(PRICE, 2, seconds)
    assert ended.provider_amount + ended.platform_fee == ended.cost
    both = Hold.objects.filter(pk__in=[lease.hold_id, ext.hold_id])
    assert {h.status for h in both} == {"captured"}
    assert sum(h.captured for h in both) == ended.cost
    assert sum(h.captured_fee for h in both) == ended.platform_fee
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - ended.cost
    assert ledger.wallet(user_id=buyer.pk).held == 0


def test_a_pending_lease_extends_its_duration_and_keeps_interruptible():
    buyer, lease, _, _ = _lease(interruptible=True)
    r = _extend(buyer, lease.pk, {"seconds": 900})
    assert r.status_code == 200, r.content
    assert r.json()["duration_seconds"] == 4500 and r.json()["ends_at"] is None
    assert r.json()["interruptible"] is True


def _refused_409(buyer, lease_id, body, contains):
    before = snapshot(buyer)
    r = _extend(buyer, lease_id, body)
    assert r.status_code == 409, r.content
    assert contains in r.json()["detail"], r.json()
    assert snapshot(buyer) == before
    assert not LeaseExtension.objects.exists()
    return r


def test_extend_beyond_the_asks_window_is_409_naming_its_end():
    until = timezone.now() + timedelta(hours=3)
    buyer, lease, _, _ = _lease(until=until)
    _run(lease, ago=0)
    r = _refused_409(buyer, lease.pk, {"hours": 3}, "the window ends at ")
    assert until.isoformat() in r.json()["detail"]
    assert _extend(buyer, lease.pk, {"hours": 1}).status_code == 200  # within it: fine


def test_extend_without_the_funds_is_409_naming_need_and_have():
    buyer, lease, _, _ = _lease(usd=3)  # 2.49 held for the hour, 0.51 left
    r = _refused_409(buyer, lease.pk, {"hours": 1},
                     "insufficient funds: the extension needs 2.490000 USD")
    assert "0.510000 USD available" in r.json()["detail"]


def test_extend_an_ended_or_preemption_scheduled_lease_is_409():
    buyer, lease, _, _ = _lease()
    Lease.objects.filter(pk=lease.pk).update(preempt_at=timezone.now() + timedelta(minutes=2))
    _refused_409(buyer, lease.pk, {"hours": 1}, "scheduled for preemption")
    Lease.objects.filter(pk=lease.pk).update(preempt_at=None)
    _run(lease, ago=3700)  # its hour is over; the runner has not reported yet
    _refused_409(buyer, lease.pk, {"hours": 1}, "time is over")
    _stop(buyer, lease.pk)
    _refused_409(buyer, lease.pk, {"hours": 1}, "has ended (cancelled)")


def test_extend_on_a_silent_node_or_an_unhealthy_gpu_is_409():
    buyer, lease, node, _ = _lease()
    gpu = lease.lease_gpus.get().gpu
    type(gpu).objects.filter(pk=gpu.pk).update(healthy=False)
    _refused_409(buyer, lease.pk, {"hours": 1}, f"GPU {gpu.uuid} of the lease is unhealthy")
    type(gpu).objects.filter(pk=gpu.pk).update(healthy=True)
    type(node).objects.filter(pk=node.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1))
    _refused_409(buyer, lease.pk, {"hours": 1}, "is not active: no heartbeat since")


@pytest.mark.parametrize(("body", "field"), [
    ({"hours": 0}, "hours"), ({"hours": -1}, "hours"), ({"hours": 1.5}, "hours"),
    ({"hours": "2"}, "hours"), ({"hours": True}, "hours"), ({"seconds": 0}, "seconds"),
    ({"seconds": 10**12}, "seconds"), ({"hours": 1, "seconds": 60}, "seconds"),
    ({}, "hours"), ({"hours": 1, "minutes": 5}, "minutes"), ({"hours": None}, "hours"),
])
def test_bad_extend_input_is_400_naming_the_field_and_writes_nothing(body, field):
    buyer, lease, _, _ = _lease()
    before = snapshot(buyer)
    assert_refused(_extend(buyer, lease.pk, body), field)
    assert snapshot(buyer) == before
    assert Lease.objects.get(pk=lease.pk).duration_seconds == 3600


def test_an_extension_that_would_last_beyond_a_year_is_400_naming_hours():
    buyer, lease, _, _ = _lease(until=timezone.now() + timedelta(days=800))
    assert_refused(_extend(buyer, lease.pk, {"hours": 366 * 24}), "hours",
                   contains="a lease lasts at most")


def _sealed_lease(provider, node, buyer):
    """A 4-GPU lot of the node (of 8) won by `buyer`'s sealed bid, closed now."""
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=4,
                                    reserve_price=1_100_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk, price=1_200_000)
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    return Lease.objects.get(sealed_bid__auction=auction)


def test_a_sealed_bid_lease_extends_within_the_providers_ask_and_stops_exactly():
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer = funded_buyer(100)
    lease = _sealed_lease(provider, node, buyer)
    _run(lease, ago=100)
    _refused_409(buyer, lease.pk, {"hours": 1}, "in no standing ask beyond the auction's lot")

    other_provider, other_node, _ = registered_node(name="node-2")
    ask(other_provider, other_node, gpus=2)  # another node's ask opens no window here
    _refused_409(buyer, lease.pk, {"hours": 1}, "in no standing ask")

    until = timezone.now() + timedelta(hours=5)
    ask(provider, node, gpus=4, until=until)  # the rest of the node, until then
    _refused_409(buyer, lease.pk, {"hours": 5}, f"the window ends at {until.isoformat()}")
    holds = Hold.objects.count()
    r = _extend(buyer, lease.pk, {"hours": 2})
    assert r.status_code == 200, r.content
    assert r.json()["duration_seconds"] == 3600 * 3 and Hold.objects.count() == holds + 1
    assert _stop(buyer, lease.pk).status_code == 200
    ended = Lease.objects.get(pk=lease.pk)
    _assert_settled_exactly(ended, int((ended.ended_at - ended.started_at).total_seconds()))
    assert ledger.wallet(user_id=buyer.pk).held == 0


def test_extend_after_the_provider_withdrew_the_ask_is_409():
    buyer, lease, _, _ = _lease()
    ask_order = Order.objects.get(pk=lease.ask_id)
    book.cancel_order(user_id=ask_order.owner_id, order_id=ask_order.pk)
    _refused_409(buyer, lease.pk, {"hours": 1},
                 f"the window is closed: the provider's ask {ask_order.pk} is cancelled")
