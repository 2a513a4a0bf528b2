"""A lease picking MIG slices while a new layout deletes one of them, on real PostgreSQL
with two connections (issue 13): never a 500. The layout change first: the bid waits for
it, then gets a 409 naming `gpus` and nothing is written. The lease first: the layout
change waits for it, then gets the 409 naming the lease; the slice stays listed.
Each side's transaction is held open (threading.Event) until the other is seen waiting
on its row lock in pg_stat_activity."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from django.db import connection, connections, transaction

from marketplace import book
from marketplace.models import Lease
from providers import services as provider_services
from providers.models import Gpu
from providers.runner import mig as runner_mig
from settlement.checks import first_violation
from tests.factories import H100, H100_MIG, bid_body, funded_buyer, in_a_day, mig_node
from tests.support.api import assert_refused, client_for, runner_client, snapshot
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ONE_G = f"{H100}.1g.10gb"  # 2 slices on the recorded MIG H100
DEVICES = H100_MIG.gpus[0].mig_devices
ONES = sorted(d.uuid for d in DEVICES if d.profile == "1g.10gb")


def _layout(*leaving: str) -> list[dict]:
    kept = tuple(d for d in DEVICES if d.uuid not in leaving)
    return runner_mig.inventory_items(
        replace(H100_MIG, gpus=[replace(H100_MIG.gpus[0], mig_devices=kept)]))


# the new layout drops one 1g.10gb slice (the market still reported), or both (the
# 1g.10gb market no longer among the report's: nothing but the units' locks orders them)
LEAVING = [pytest.param(ONES[1:], id="one-slice-leaves"),
           pytest.param(ONES, id="the-profile-leaves")]
BODY = {"hostname": "mig-host", "driver_version": "590.48.01", "cuda_version": "13.1",
        "runner_version": "test", "source": "test"}


def _in_thread(call, results: list) -> threading.Thread:
    def run():
        try:
            results.append(call())
        except BaseException as exc:  # part of the outcome
            results.append(exc)
        finally:
            connections.close_all()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _held_open(work, held: threading.Event, release: threading.Event):
    """`work()` inside a transaction that stays open until `release`."""
    def call():
        with transaction.atomic():
            out = work()
            held.set()
            assert release.wait(30)
        return out
    return call


def _someone_waits_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'")
        return cur.fetchone()[0] > 0


def _market():
    provider, node, token = mig_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=ONE_G, price=400_000,
                   gpus=2, available_until=in_a_day())
    return node, token


@pytest.mark.parametrize("leaving", LEAVING)
def test_a_bid_meeting_a_layout_change_that_deletes_its_slice_gets_a_409(leaving):
    node, _token = _market()
    buyer = funded_buyer(100)
    before = snapshot(buyer)
    held, release, results = threading.Event(), threading.Event(), []
    layout = _in_thread(_held_open(lambda: provider_services.inventory_record(
        node=node, gpus=_layout(*leaving), **BODY), held, release), results)
    wait_until("the new layout to be written (not committed)", held.is_set, timeout=30)
    answers: list = []
    bid = _in_thread(lambda: client_for(buyer).post(
        "/api/v1/orders/", bid_body(gpu_class=ONE_G, gpus=2), format="json"), answers)
    wait_until("the bid to wait on the slices' lock", _someone_waits_on_a_lock, timeout=30)
    release.set()
    layout.join(30)
    bid.join(30)
    assert not isinstance(results[0], BaseException), results
    assert_refused(answers[0], "gpus", status=409, contains="changed while this lease was")
    assert snapshot(buyer) == before  # no order, hold, lease
    assert not Gpu.every.filter(uuid__in=leaving).exists()
    assert first_violation() is None


@pytest.mark.parametrize("leaving", LEAVING)
def test_a_layout_change_meeting_a_lease_on_its_slice_gets_a_409_naming_the_lease(leaving):
    node, token = _market()
    buyer = funded_buyer(100)
    held, release, placed = threading.Event(), threading.Event(), []
    bid = _in_thread(_held_open(lambda: book.place_bid(
        buyer_id=buyer.pk, market_slug=ONE_G, price=450_000, gpus=2, duration_seconds=600),
        held, release), placed)
    wait_until("the lease to be made (not committed)", held.is_set, timeout=30)
    answers: list = []
    layout = _in_thread(lambda: runner_client(token).post(
        "/api/v1/runner/inventory/", {**BODY, "gpus": _layout(*leaving)}, format="json"), answers)
    wait_until("the layout change to wait on the slices' lock", _someone_waits_on_a_lock,
               timeout=15)
    release.set()
    bid.join(30)
    layout.join(30)
    [lease] = placed[0].leases
    assert sorted(lg.gpu.uuid for lg in Lease.objects.get(pk=lease.pk).lease_gpus.all()) == ONES
    assert_refused(answers[0], "gpus", status=409, contains=f"lease {lease.pk} runs on")
    assert Gpu.objects.filter(uuid__in=leaving, node=node).count() == len(leaving)  # listed
    assert first_violation() is None
