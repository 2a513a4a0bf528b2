"""The hour boundary's re-match (marketplace/fills_many.py): a batch's returned GPUs
re-match set-wise (apply_results_many) exactly as matching.apply_result writes each
result, in chunks and bounded passes that change nothing of the outcome;
settlement.bulk.holds_reduce_many is hold_reduce per cut; GPUMARKET_LEASE_END_BATCH is
refused at startup unless an integer >= 1."""

import re
from datetime import timedelta

import pytest
from django.db import transaction

from marketplace import book, fills_many, lease_end
from marketplace.lease_end import end_leases_batch
from marketplace.leases import mark_running
from marketplace.models import Lease, LeaseEvent, LeaseGpu, Order, OrderEvent
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import Account, Hold, JournalEntry
from settlement.money import lease_cost
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.test_deploy_settings import _django
from webhooks.models import WebhookEndpoint, WebhookEvent

pytestmark = pytest.mark.django_db

PRICE = 2_490_001  # odd: the floors show
MARKET = "h100-sxm-80gb"
CAUSE = "lease time is over; the runner did not report the end"


class _Rollback(Exception):
    pass


def _market():
    """Two nodes' asks (4 GPUs each) sold out as six running leases; resting bids that
    the returned GPUs re-match: 2, 3 in gangs of 1 (it spans both nodes: two results),
    2, 1, and one of 4 that finds no node with 4 left; every buyer has a webhook
    endpoint for order.filled."""
    asks = []
    for i in range(2):
        provider, node, _ = registered_node(name=f"n{i}", own_uuids=True)
        asks.append(book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                                   price=PRICE, gpus=4, available_until=in_a_day()).order)
    leases = []
    for gpus in (2, 1, 1, 2, 1, 1):
        buyer = funded_buyer(1000)
        [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=PRICE,
                                 gpus=gpus, duration_seconds=3600).leases
        leases.append(mark_running(lease=lease, container_id="e" * 64))
    rest = []
    for gpus, gang in ((2, None), (3, 1), (2, None), (1, None), (4, None)):
        buyer = funded_buyer(1000)
        WebhookEndpoint.objects.create(user=buyer, url="http://127.0.0.1:9/hook",
                                       events=["order.filled"], secret_sealed="-")
        rest.append(book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=PRICE,
                                   gpus=gpus, gang_size=gang, duration_seconds=3600).order)
    return [x.pk for x in leases], [o.pk for o in rest]


def _hold_of(lease) -> bool:
    """Whether the new lease's hold is its cost at the trade price, named for it."""
    return Hold.objects.values_list("amount", "reference").get(pk=lease.hold_id) == (
        lease_cost(lease.price, lease.gpu_count, 3600), f"lease:{lease.pk}")


def _outcome(ids, rest_ids):
    """What the ends and re-matches wrote, with the ids that differ between runs
    (sequences do not roll back: new leases, fills) left out."""
    new = Lease.objects.exclude(pk__in=ids)
    refs = {f"lease:{pk}" for pk in ids}

    def memo(text):
        return re.sub(r"(fill|lease) \d+", r"\1 N", text)

    return {
        "orders": sorted(Order.objects.values_list("pk", "status", "remaining_gpus")),
        "order_events": sorted((e.order_id, e.from_status, e.to_status, memo(e.cause), e.at)
                               for e in OrderEvent.objects.all()),
        "new_leases": sorted((x.fill.bid_id, x.fill.ask_id, x.gpu_count, x.price, x.status,
                              x.buyer_id, x.provider_id, x.node_id, _hold_of(x)) for x in new),
        "new_lease_events": sorted((e.lease.fill.bid_id, e.from_status, e.to_status,
                                    len(e.detail["gpus"]))
                                   for e in LeaseEvent.objects.filter(lease__in=new)),
        "gpus_busy": LeaseGpu.objects.filter(active=True).count(),
        "holds": sorted((h.reference if h.reference in refs or not
                         h.reference.startswith("lease:") else "new", h.status, h.original,
                         h.amount, h.captured, h.released) for h in Hold.objects.all()),
        "accounts": sorted(Account.objects.values_list("kind", "owner_id", "balance")),
        "journal": sorted((e.kind, memo(e.memo), sorted(p.amount for p in e.postings.all()))
                          for e in JournalEntry.objects.prefetch_related("postings")),
        "hooks": sorted((w.user_id, w.type, w.payload["order"], w.payload["status"],
                         w.payload["gpus"], w.payload["remaining_gpus"])
                        for w in WebhookEvent.objects.filter(type="order.filled")),
        "resting": [Order.objects.values_list("status", "remaining_gpus").get(pk=pk)
                    for pk in rest_ids],
    }


def _run(ids, now, rest_ids, monkeypatch, **patches) -> dict:
    """end_leases_batch with fills_many / lease_end attributes patched, rolled back."""
    with monkeypatch.context() as m:
        for name, value in patches.items():
            m.setattr(lease_end if name == "LEASE_END_CHUNK" else fills_many, name, value)
        try:
            with transaction.atomic():
                assert end_leases_batch(market_id=Lease.objects.get(pk=ids[0]).market_id,
                                        lease_ids=ids, status="completed", cause=CAUSE,
                                        now=now) == ids
                assert first_violation() is None
                out = _outcome(ids, rest_ids)
                raise _Rollback
        except _Rollback:
            return out


def test_set_wise_chunked_and_bounded_rematch_write_what_apply_result_writes(monkeypatch):
    ids, rest_ids = _market()
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(hours=1, minutes=2)
    passes = []
    real_pass = fills_many.rematch_pass

    def counted(*a, **k):
        passes.append(1)
        return real_pass(*a, **k)

    one_by_one = _run(ids, now, rest_ids, monkeypatch, _set_wise=lambda *a: False)
    set_wise = _run(ids, now, rest_ids, monkeypatch)
    bounded = _run(ids, now, rest_ids, monkeypatch, REMATCH_MAX_FILLS=1, rematch_pass=counted)
    assert set_wise == one_by_one
    assert bounded == one_by_one
    assert len(passes) == 2  # one ask a pass (each made fills): two asks, two passes
    # two leases to a transaction: each ask takes its GPUs back in steps, the rest alike
    chunked = _run(ids, now, rest_ids, monkeypatch, REMATCH_MAX_FILLS=1, LEASE_END_CHUNK=2)

    def returns(out):
        return [e for e in out["order_events"] if "returned from an ended lease" in e[3]]

    assert {**chunked, "order_events": []} == {**one_by_one, "order_events": []}
    assert [e for e in chunked["order_events"] if e not in returns(chunked)] \
        == [e for e in one_by_one["order_events"] if e not in returns(one_by_one)]
    assert len(returns(chunked)) == 4 and len(returns(one_by_one)) == 2
    # every resting bid but the last re-matched; the 3-GPU bid across both nodes
    assert [s for s, _ in set_wise["resting"]] == ["filled"] * 4 + ["open"]
    assert sorted(g for b, _, g, *_ in set_wise["new_leases"] if b == rest_ids[1]) == [1, 2]
    assert len(set_wise["new_leases"]) == 5 and set_wise["hooks"]
    assert set_wise["gpus_busy"] == 8  # every returned GPU sold again


def test_one_pass_when_the_resting_bids_want_no_more_than_the_bound(monkeypatch):
    ids, rest_ids = _market()
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(hours=1, minutes=2)
    passes = []
    real_pass = fills_many.rematch_pass

    def counted(*a, **k):
        passes.append(1)
        return real_pass(*a, **k)

    out = _run(ids, now, rest_ids, monkeypatch, REMATCH_MAX_FILLS=12, rematch_pass=counted)
    assert len(passes) == 1  # the bids want 12 GPUs: never more fills than that
    assert [s for s, _ in out["resting"]] == ["filled"] * 4 + ["open"]


def test_holds_reduce_many_is_hold_reduce_per_cut_and_refuses_whole():
    buyers = [funded_buyer(100) for _ in range(2)]
    holds = [ledger.hold_place(buyer_id=b.pk, amount=50_000_000, reference=f"order:{i}")
             for i, b in enumerate(buyers)]
    cuts = [(holds[0].pk, 10_000_000, "fill 1"), (holds[1].pk, 0, "fill 2"),
            (holds[0].pk, 15_000_001, "fill 3")]

    def state():
        return (sorted(Hold.objects.values_list("pk", "amount", "released", "status")),
                sorted(Account.objects.values_list("kind", "owner_id", "balance")),
                sorted(JournalEntry.objects.filter(kind="hold_reduce")
                       .values_list("memo", "reference", "hold_id")))

    try:
        with transaction.atomic():
            for pk, amount, cause in cuts:
                hold = Hold.objects.get(pk=pk)
                ledger.hold_reduce(hold_id=pk, to_amount=hold.amount - amount, cause=cause)
            one_by_one = state()
            raise _Rollback
    except _Rollback:
        pass
    assert ledger_bulk.holds_reduce_many(cuts) == [10_000_000, 0, 15_000_001]
    assert state() == one_by_one
    before = state()
    with pytest.raises(ValueError, match="cannot reduce"):
        ledger_bulk.holds_reduce_many([(holds[1].pk, 1, "a"), (holds[0].pk, 24_999_999 + 2,
                                                                "b")])
    assert state() == before
    ledger_bulk.holds_release_many([(h.pk, "done") for h in holds])  # no bid: let go
    assert first_violation() is None


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("value", ["0", "-3", "twenty", "2.5"])
def test_a_bad_lease_end_batch_is_refused_at_startup_naming_it(tmp_path, value):
    done = _django(tmp_path, "manage.py", "check", GPUMARKET_LEASE_END_BATCH=value)
    assert done.returncode == 1
    assert "GPUMARKET_LEASE_END_BATCH must be an integer >= 1" in done.stderr, done.stderr


def test_the_lease_end_batch_is_read_from_the_environment(tmp_path):
    show = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.GPUMARKET_LEASE_END_BATCH)")
    assert _django(tmp_path, "-c", show).stdout.split() == ["200"]
    assert _django(tmp_path, "-c", show, GPUMARKET_LEASE_END_BATCH="20").stdout.split() \
        == ["20"]
