"""The set-based paths of issue 17 write what the one-at-a-time paths write: a batch of
lease ends (lease_end_many) against end_lease one by one, a metering run (meter_leases)
against meter_lease per lease, a sealed close's losers (auctions._lose_all) against
hold_release + set_status + emit per bid; the ledger stays exact (ledger_check)."""

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace import book
from marketplace.auctions import _bid_event, _lose_all, open_auction, place_sealed_bid
from marketplace.lease_control import extend_lease
from marketplace.lease_end import end_lease, end_leases_batch
from marketplace.leases import mark_running, meter_lease, meter_running_leases
from marketplace.models import Auction, Lease, LeaseEvent, Order, SealedBid
from marketplace.states import IllegalTransition
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Account, Hold, JournalEntry
from tests.factories import funded_buyer, in_a_day, registered_node
from webhooks import events as webhooks
from webhooks.models import WebhookEndpoint, WebhookEvent

pytestmark = pytest.mark.django_db

PRICE = 2_490_001  # odd: the floors of the split show
MARKET = "h100-sxm-80gb"
CAUSE = "lease time is over; the runner did not report the end"


class _Rollback(Exception):
    pass


def _hook(user, *events):
    WebhookEndpoint.objects.create(user=user, url="http://127.0.0.1:9/hook",
                                   events=list(events), secret_sealed="-")


def _market_with_running_leases():
    """Two providers' asks (4 and 2 GPUs), five running leases of 1–2 GPUs on them (one
    extended by 10 minutes, one metered once), a webhook endpoint for one buyer, and two
    resting bids (1 and 3 GPUs) that the returned GPUs re-match."""
    asks = []
    for i, gpus in enumerate((4, 2)):
        provider, node, _ = registered_node(name=f"n{i}", own_uuids=True)
        asks.append(book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                                   price=PRICE, gpus=gpus, available_until=in_a_day()).order)
    leases = []
    for gpus in (2, 1, 1, 1, 1):
        buyer = funded_buyer(1000)
        [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=PRICE,
                                 gpus=gpus, duration_seconds=3600).leases
        leases.append(mark_running(lease=lease, container_id="e" * 64))
    _hook(leases[0].buyer, "lease.stopped")
    extend_lease(buyer_id=leases[1].buyer_id, lease_id=leases[1].pk, seconds=600)
    meter_lease(lease_id=leases[2].pk,
                now=leases[2].started_at + timedelta(
                    seconds=settings.GPUMARKET_METER_INTERVAL_SECONDS + 5))
    rest = [book.place_bid(buyer_id=funded_buyer(1000).pk, market_slug=MARKET, price=PRICE,
                           gpus=g, duration_seconds=3600).order for g in (1, 3)]
    return [lease.pk for lease in leases], [a.pk for a in asks], [o.pk for o in rest]


def _journal(refs: set[str]) -> list:
    """Every entry as (kind, reference, memo, key, postings by (account kind, owner));
    references of leases made in the run and fill ids (sequences do not roll back, so
    they differ between runs) read "new" and "fill N"."""
    out = []
    for e in JournalEntry.objects.prefetch_related("postings__account"):
        ref = e.reference if e.reference in refs or not e.reference.startswith("lease:") \
            else "new"
        key = e.idempotency_key if ref != "new" else "new"
        memo = re.sub(r"fill \d+", "fill N", e.memo) if ref != "new" else ""
        out.append((e.kind, ref, memo, key, sorted(
            (p.account.kind, p.account.owner_id, p.amount) for p in e.postings.all())))
    return sorted(out)


def _outcome(ids, ask_ids, rest_ids):
    refs = {f"lease:{pk}" for pk in ids}
    leases = list(Lease.objects.filter(pk__in=ids).order_by("pk"))
    return {
        "leases": [(x.status, x.cost, x.platform_fee, x.provider_amount, x.cause, x.ended_at,
                    x.settled_at) for x in leases],
        "events": sorted((e.lease_id, e.from_status, e.to_status, e.cause, e.at,
                          tuple(sorted(e.detail.items())))
                         for e in LeaseEvent.objects.filter(lease_id__in=ids)),
        "holds": sorted((h.reference, h.status, h.original, h.amount, h.captured,
                         h.captured_fee, h.released) for h in Hold.objects.all()
                        if h.reference in refs or not h.reference.startswith("lease:")),
        "accounts": sorted(Account.objects.values_list("kind", "owner_id", "balance")),
        "journal": _journal(refs),
        "webhooks": sorted((w.user_id, w.type, w.payload["lease"], w.payload["cost_usd_micros"])
                           for w in WebhookEvent.objects.filter(type="lease.stopped")),
        "asks": [Order.objects.values_list("status", "remaining_gpus").get(pk=pk)
                 for pk in ask_ids],
        "resting": [Order.objects.values_list("status", "remaining_gpus").get(pk=pk)
                    for pk in rest_ids],
        "new_leases": sorted(Lease.objects.exclude(pk__in=ids)
                             .values_list("fill__bid_id", "gpu_count", "price", "ask_id")),
    }


def test_a_batch_of_lease_ends_writes_what_end_lease_writes_one_by_one():
    ids, ask_ids, rest_ids = _market_with_running_leases()
    market_id = Lease.objects.get(pk=ids[0]).market_id
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(hours=1, minutes=2)
    try:
        with transaction.atomic(), CaptureQueriesContext(connection) as single:
            for pk in ids:
                end_lease(lease_id=pk, status="completed", cause=CAUSE, now=now)
            statements_one_by_one = len(single)
            one_by_one = _outcome(ids, ask_ids, rest_ids)
            raise _Rollback
    except _Rollback:
        pass
    assert set(Lease.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"running"}

    with CaptureQueriesContext(connection) as queries:
        assert end_leases_batch(market_id=market_id, lease_ids=ids, status="completed",
                                cause=CAUSE, now=now) == ids
    batched = _outcome(ids, ask_ids, rest_ids)
    assert batched == one_by_one
    assert batched["webhooks"] and batched["new_leases"]  # told, and re-matched
    assert [s for s, _ in batched["resting"]] == ["filled", "filled"]
    assert first_violation() is None
    # fewer statements (Django's cursor only: core.bulk's do not appear in either count,
    # and the one-by-one path makes fewer of those)
    assert len(queries) < statements_one_by_one


def test_set_status_many_refuses_an_illegal_move_and_changes_nothing():
    ids, _, _ = _market_with_running_leases()
    leases = list(Lease.objects.filter(pk__in=ids).order_by("pk"))
    leases[0].status = "completed"
    with pytest.raises(IllegalTransition):
        Lease.set_status_many(leases, "completed", causes=["x"] * len(leases))
    assert set(Lease.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"running"}


def _meter_outcome(ids):
    return {"holds": sorted(Hold.objects.values_list("reference", "status", "amount",
                                                     "captured", "captured_fee",
                                                     "released")),
            "accounts": sorted(Account.objects.values_list("kind", "owner_id", "balance")),
            "journal": _journal({f"lease:{pk}" for pk in ids})}


def test_a_metering_run_writes_what_meter_lease_writes_per_lease_and_only_once():
    ids, _, _ = _market_with_running_leases()
    interval = settings.GPUMARKET_METER_INTERVAL_SECONDS
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(seconds=2 * interval + 3)
    try:
        with transaction.atomic():
            single = [pk for pk in ids if meter_lease(lease_id=pk, now=now)]
            one_by_one = _meter_outcome(ids)
            raise _Rollback
    except _Rollback:
        pass
    assert len(single) == 4  # the fifth was metered through its whole hour already
    assert meter_running_leases(now=now, batch=2) == single
    assert _meter_outcome(ids) == one_by_one
    assert meter_running_leases(now=now) == []  # the same period: nothing again
    assert _meter_outcome(ids) == one_by_one
    assert first_violation() is None


def test_a_metering_run_that_crashes_midway_charges_the_rest_once_when_run_again(
        monkeypatch):
    """A run that dies after its first batch committed (the worker killed) keeps that
    batch; the next run charges only the others, and the ledger ends as one run leaves it."""
    ids, _, _ = _market_with_running_leases()
    interval = settings.GPUMARKET_METER_INTERVAL_SECONDS
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(seconds=2 * interval + 3)
    try:
        with transaction.atomic():
            assert len(meter_running_leases(now=now)) == 4
            whole = _meter_outcome(ids)
            raise _Rollback
    except _Rollback:
        pass
    real, calls = ledger_bulk.holds_capture_batch, []

    def dies_second(charges):  # the second batch dies after its writes, before commit
        calls.append(len(charges))
        out = real(charges)
        if len(calls) == 2:
            raise RuntimeError("worker killed")
        return out

    monkeypatch.setattr(ledger_bulk, "holds_capture_batch", dies_second)
    with pytest.raises(RuntimeError):
        meter_running_leases(now=now, batch=2)
    monkeypatch.setattr(ledger_bulk, "holds_capture_batch", real)
    first = JournalEntry.objects.filter(kind="lease_meter", reference__in=[
        f"lease:{pk}" for pk in ids[:2]]).count()
    assert first == 2  # the first batch's two leases stand (never metered before)
    again = meter_running_leases(now=now)
    assert len(again) == 2 and not set(again) & set(ids[:2])
    assert _meter_outcome(ids) == whole
    assert meter_running_leases(now=now) == []
    assert first_violation() is None


def test_holds_release_many_is_hold_release_per_hold_and_refuses_whole():
    buyers = [funded_buyer(10) for _ in range(3)]
    holds = [ledger.hold_place(buyer_id=b.pk, amount=1_000_001 + i, reference=f"t:{i}")
             for i, b in enumerate(buyers)]
    try:
        with transaction.atomic():
            single = [ledger.hold_release(hold_id=h.pk, cause="c") for h in holds]
            one_by_one = _meter_outcome([])
            raise _Rollback
    except _Rollback:
        pass
    before = _meter_outcome([])
    with pytest.raises(ledger.HoldClosed):  # the same hold twice: nothing released
        ledger_bulk.holds_release_many([(holds[0].pk, "c"), (holds[0].pk, "c")])
    assert _meter_outcome([]) == before
    assert ledger_bulk.holds_release_many([(h.pk, "c") for h in holds]) == single
    assert _meter_outcome([]) == one_by_one
    with pytest.raises(ledger.HoldClosed):  # closed now: nothing changes
        ledger_bulk.holds_release_many([(holds[0].pk, "c")])
    assert _meter_outcome([]) == one_by_one
    assert first_violation() is None


def test_a_sealed_close_loses_its_bids_as_one_by_one_would():
    provider, node, _ = registered_node()
    now = timezone.now()
    auction = open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                           reserve_price=1_000_000, duration_seconds=3600,
                           closes_at=now + timedelta(hours=1), rule=Auction.Rule.UNIFORM_PRICE)
    bids = []
    for i in range(4):
        buyer = funded_buyer(100)
        if i == 1:
            _hook(buyer, "auction.lost")
        bids.append(place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk,
                                     price=1_000_000 + 7 * i, gpus=2,
                                     now=now + timedelta(seconds=1)))
    at = now + timedelta(hours=1, seconds=1)
    lost = [(b, f"auction {auction.pk} lost", "lost") for b in bids]

    def outcome():
        return {"bids": sorted(SealedBid.objects.values_list("pk", "status")),
                "ledger": _meter_outcome([]),
                "hooks": sorted((w.user_id, w.type, tuple(sorted(w.payload.items())))
                                for w in WebhookEvent.objects.all())}
    try:
        with transaction.atomic():
            for bid in [SealedBid.objects.get(pk=b.pk) for b in bids]:
                ledger.hold_release(hold_id=bid.hold_id, cause=f"auction {auction.pk} lost")
                bid.set_status("lost", cause="lost", at=at)
                webhooks.emit(bid.bidder_id, "auction.lost", _bid_event(auction, bid, "lost"))
            one_by_one = outcome()
            raise _Rollback
    except _Rollback:
        pass
    with transaction.atomic():
        _lose_all(auction, [(SealedBid.objects.get(pk=b.pk), c, w) for b, c, w in lost], at)
    assert outcome() == one_by_one
    assert len(one_by_one["hooks"]) == 1
    assert first_violation() is None


def test_uncached_accounts_are_looked_up_with_one_term_per_kind(monkeypatch):
    from settlement import account_rows

    buyers = [funded_buyer(1) for _ in range(30)]
    ledger._account_ids.clear()
    keys = [(kind, b.pk) for b in buyers for kind in (ledger.Kind.BUYER_AVAILABLE,
                                                      ledger.Kind.BUYER_HELD)]
    sent = []
    real = account_rows.execute_arrays

    def recording(connection, sql, params):
        sent.append((sql, params))
        return real(connection, sql, params)

    monkeypatch.setattr(account_rows, "execute_arrays", recording)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = ledger._lock_accounts(keys)
    assert len(queries) == 0 and len(sent) == 2  # the look-up and the lock, arrays bound
    lookup, params = sent[0]
    # one term per kind (owner_id = ANY(one array)), not one per account: 2 kinds, 60
    assert lookup.count("kind = %s") == 2 and lookup.count("= ANY(%s::bigint[])") == 2
    assert sorted(p for p in params if isinstance(p, str)) == sorted(
        [ledger.Kind.BUYER_AVAILABLE, ledger.Kind.BUYER_HELD])
    assert [sorted(p) for p in params if isinstance(p, list)] == [
        sorted(b.pk for b in buyers)] * 2
    lock, (ids,) = sent[1]
    assert "FOR UPDATE" in lock and ids == sorted(ids) and len(ids) == len(locked)
    assert set(locked) == {k for k in keys if k[0] == ledger.Kind.BUYER_AVAILABLE}
