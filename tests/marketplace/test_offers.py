"""The offers behind a market's book (marketplace/offers.py) and bids for one node: the
engine fills a bid naming a node only against that node's asks (both directions, FOK),
the book keeps the constraint in fresh, cached and rebuilt books, and preemption never
frees another node's GPUs for it; the offer rows, their filters and sorts."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace import engine, locking, offers
from marketplace.errors import Conflict, InvalidInput
from marketplace.models import GpuClass, Order
from providers.models import Gpu, GpuBenchmark
from tests.factories import H100, ask, bid, funded_buyer, registered_node

NOW = 1_700_000_000
UNTIL = NOW + 86_400


def _ask(i, price, gpus=2):
    return engine.Ask(id=i, owner=100 + i, price=price, gpus=gpus, node=i,
                      available_until=UNTIL, seq=i)


def _bid(i, price, node=0, gpus=2, tif="GTC"):
    return engine.Bid(id=i, owner=200 + i, price=price, gpus=gpus, gang=gpus,
                      duration_s=3600, seq=i, tif=tif, node=node)


def test_engine_a_bid_for_one_node_skips_cheaper_asks_of_other_nodes():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000))
    ob.rest_ask(_ask(2, 2_000_000))
    result = ob.submit_bid(_bid(10, 3_000_000, node=2), NOW)
    assert [(f.ask_id, f.node, f.gpus, f.price) for f in result.fills] == [(2, 2, 2, 2_000_000)]
    assert ob.asks()[0].id == 1  # the cheaper ask of node 1 is untouched


def test_engine_a_resting_bid_for_one_node_fills_only_when_that_node_asks():
    ob = engine.OrderBook()
    ob.rest_bid(_bid(10, 3_000_000, node=2))
    assert ob.submit_ask(_ask(1, 1_000_000), NOW).fills == []
    fills = ob.submit_ask(_ask(2, 1_500_000), NOW).fills
    assert [(f.bid_id, f.node) for f in fills] == [(10, 2)]


def test_engine_fok_for_one_node_is_killed_when_only_other_nodes_could_fill_it():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000))
    result = ob.submit_bid(_bid(10, 3_000_000, node=2, tif="FOK"), NOW)
    assert result.killed and result.fills == [] and ob.asks()[0].gpus == 2


@pytest.fixture
def two_nodes(db):
    p1, n1, _ = registered_node(name="alpha", own_uuids=True)
    p2, n2, _ = registered_node(name="beta", own_uuids=True, cuda_version="12.4")
    n1.provider.display_name, n2.provider.display_name = "Acme", "Bolt"
    n1.provider.save()
    n2.provider.save()
    ask(p1, n1, price=1_000_000, gpus=8)
    ask(p2, n2, price=2_000_000, gpus=4)
    return (p1, n1), (p2, n2)


@pytest.mark.django_db
def test_a_bid_for_one_node_fills_there_not_at_the_cheaper_ask(two_nodes):
    (_, n1), (_, n2) = two_nodes
    placed = bid(funded_buyer(), price=3_000_000, gpus=2, node=n2.pk)
    assert [lease.node_id for lease in placed.leases] == [n2.pk]
    assert placed.leases[0].price == 2_000_000
    assert Order.objects.get(node=n1).remaining_gpus == 8


@pytest.mark.django_db
def test_a_resting_bid_for_one_node_keeps_its_node_in_the_book_read_back(two_nodes):
    (_p1, _n1), (p2, n2) = two_nodes
    Order.objects.filter(node=n2).update(status="cancelled")
    locking.book_cache.clear()
    resting = bid(funded_buyer(), price=3_000_000, gpus=2, node=n2.pk).order
    assert resting.status == "open" and resting.node_id == n2.pk
    market = GpuClass.objects.get(slug=H100)
    rebuilt = locking.build_book(market)
    assert [b.node for b in rebuilt.bids()] == [n2.pk]
    resting.refresh_from_db()
    assert resting.remaining_gpus == 2  # node 1's ask (open all along) did not fill it
    placed = ask(p2, n2, price=2_500_000, gpus=2)
    assert [lease.node_id for lease in placed.leases] == [n2.pk]
    resting.refresh_from_db()
    assert resting.status == "filled"


@pytest.mark.django_db
def test_a_bid_for_a_node_without_gpus_of_the_class_is_refused_naming_node(two_nodes):
    (_, n1), (_, n2) = two_nodes
    a100 = GpuClass.objects.get(slug="a100-sxm-80gb")
    with pytest.raises(InvalidInput) as exc:
        bid(funded_buyer(), node=999_999)
    assert exc.value.field == "node"
    four = Gpu.objects.filter(node=n2).order_by("pk").values_list("pk", flat=True)[:4]
    Gpu.objects.filter(pk__in=list(four)).update(gpu_class=a100)
    with pytest.raises(Conflict) as exc:  # a gang of 8 on a node of 4 such GPUs never fills
        bid(funded_buyer(usd=100_000), gpus=8, node=n2.pk)
    assert exc.value.field == "node"
    Gpu.objects.filter(node=n1).update(gpu_class=a100)
    with pytest.raises(InvalidInput) as exc:
        bid(funded_buyer(), node=n1.pk)
    assert exc.value.field == "node" and "alpha" in exc.value.message
    assert not Order.objects.filter(side="bid").exists()


@pytest.mark.django_db
def test_preemption_for_a_bid_for_one_node_frees_only_that_nodes_gpus(two_nodes, settings):
    """An interruptible lease on node alpha is outbid by a bid for node beta: nothing
    is scheduled (its GPUs would not reach that bid)."""
    (_, n1), (_, n2) = two_nodes
    Order.objects.filter(node=n2).update(status="cancelled")
    lease = bid(funded_buyer(), price=1_500_000, gpus=8, interruptible=True).leases[0]
    assert lease.node_id == n1.pk
    bid(funded_buyer(), price=3_000_000, gpus=8, node=n2.pk)
    lease.refresh_from_db()
    assert lease.preempt_at is None
    bid(funded_buyer(), price=3_000_000, gpus=8, node=n1.pk)
    lease.refresh_from_db()
    assert lease.preempt_at is not None


def _bench(node, tflops):
    for gpu in Gpu.objects.filter(node=node):
        GpuBenchmark.objects.create(gpu=gpu, measured_at=timezone.now(), correct=True,
                                    bf16_tflops=Decimal(tflops))


@pytest.mark.django_db
def test_offer_rows_say_what_tells_the_asks_apart(two_nodes):
    (_, n1), (_, _n2) = two_nodes
    _bench(n1, "700.0")
    market = GpuClass.objects.get(slug=H100)
    rows = offers.offer_rows(market)
    assert [(r["node"]["name"], r["provider"], r["price"], r["gpus_free"]) for r in rows] == [
        ("alpha", "Acme", 1_000_000, 8), ("beta", "Bolt", 2_000_000, 4)]
    assert rows[0]["measured_tflops"] == Decimal("700.0")
    assert rows[1]["measured_tflops"] is None
    assert rows[0]["datasheet_tflops"] == market.bf16_dense_tflops
    assert rows[1]["cuda_version"] == "12.4" and rows[0]["driver_version"]
    assert rows[0]["interconnect"]  # the recorded H100 host's NVLink words
    assert rows[0]["reliability"] is None  # no record yet


@pytest.mark.django_db
def test_offers_filter_and_sort(two_nodes):
    _bench(two_nodes[0][1], "700.0")
    market = GpuClass.objects.get(slug=H100)

    def names(**query):
        return [r["node"]["name"] for r in offers.offers(market, query)[1]]

    assert names() == ["alpha", "beta"]
    assert names(sort="-price") == ["beta", "alpha"]
    assert names(sort="gpus") == ["beta", "alpha"]
    assert names(min_gpus="5") == ["alpha"]
    assert names(max_price="1.5") == ["alpha"]
    assert names(max_price="2") == ["alpha", "beta"]
    assert names(provider="bolt") == ["beta"]
    assert names(min_tflops="600") == ["alpha"]
    assert names(sort="-tflops") == ["alpha", "beta"]  # unbenchmarked last
    assert names(sort="tflops") == ["alpha", "beta"]
    assert names(min_gpus="", max_price="") == ["alpha", "beta"]  # empty form fields


@pytest.mark.parametrize(("query", "field"), [
    ({"min_gpus": "0"}, "min_gpus"), ({"min_gpus": "two"}, "min_gpus"),
    ({"max_price": "-1"}, "max_price"), ({"max_price": "1.0000001"}, "max_price"),
    ({"min_cuda": "twelve"}, "min_cuda"), ({"min_tflops": "1e3"}, "min_tflops"),
    ({"min_tflops": "NaN"}, "min_tflops"), ({"sort": "color"}, "sort"),
    ({"colour": "red"}, "colour"),
])
def test_bad_filters_are_refused_naming_the_parameter(query, field):
    with pytest.raises(InvalidInput) as exc:
        offers.parse(query)
    assert exc.value.field == field
