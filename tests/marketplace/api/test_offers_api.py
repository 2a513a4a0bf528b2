"""GET /api/v1/gpu-classes/<slug>/offers/ (filters, sorts, 400 naming the parameter),
a bid for one node through POST /api/v1/orders/, and GET …/history/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.models import Fill, Order
from providers.models import Gpu, GpuBenchmark
from tests.factories import H100, ask, bid, bid_body, funded_buyer, registered_node
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db
OFFERS = f"/api/v1/gpu-classes/{H100}/offers/"
HISTORY = f"/api/v1/gpu-classes/{H100}/history/"


@pytest.fixture
def nodes():
    p1, n1, _ = registered_node(name="alpha", own_uuids=True)
    p2, n2, _ = registered_node(name="beta", own_uuids=True, cuda_version="12.4")
    n2.provider.display_name = "Bolt"
    n2.provider.save()
    ask(p1, n1, price=1_000_000, gpus=8)
    ask(p2, n2, price=2_000_000, gpus=4)
    for gpu in Gpu.objects.filter(node=n2):
        GpuBenchmark.objects.create(gpu=gpu, measured_at=timezone.now(), correct=True,
                                    bf16_tflops=Decimal("800.5"))
    return n1, n2


def _names(response):
    assert response.status_code == 200, response.content
    return [r["node"]["name"] for r in response.json()["results"]]


def test_offers_list_each_ask_with_what_tells_them_apart(nodes):
    n1, _n2 = nodes
    body = client_for().get(OFFERS).json()
    assert body["gpu_class"] == H100 and body["sort"] == "price"
    first, second = body["results"]
    assert first["node"] == {"id": n1.pk, "name": "alpha"} and first["provider"] == "Acme"
    assert (first["price"], first["gpus_free"]) == ("1.000000", 8)
    assert first["measured_tflops"] is None and first["datasheet_tflops"] == "989.4"
    assert second["measured_tflops"] == "800.5" and second["cuda_version"] == "12.4"
    assert set(first) >= {"ask", "available_until", "driver_version", "interconnect",
                          "node_gpus", "reliability"}


def test_offers_filter_and_sort_by_query(nodes):
    c = client_for()
    assert _names(c.get(OFFERS, {"sort": "-price"})) == ["beta", "alpha"]
    assert _names(c.get(OFFERS, {"sort": "-tflops"})) == ["beta", "alpha"]
    assert _names(c.get(OFFERS, {"min_gpus": "6"})) == ["alpha"]
    assert _names(c.get(OFFERS, {"max_price": "1.50"})) == ["alpha"]
    assert _names(c.get(OFFERS, {"min_cuda": "12.3"})) == ["beta"]
    assert _names(c.get(OFFERS, {"min_tflops": "800"})) == ["beta"]
    assert _names(c.get(OFFERS, {"provider": "BOLT"})) == ["beta"]
    assert _names(c.get(OFFERS, {"provider": "nobody"})) == []


@pytest.mark.parametrize(("param", "value"), [
    ("min_gpus", "-1"), ("max_price", "1e2"), ("min_cuda", "12"), ("min_tflops", "x"),
    ("sort", "price;drop"), ("limit", "5"),
])
def test_bad_offer_filters_are_a_400_naming_the_parameter(nodes, param, value):
    assert_refused(client_for().get(OFFERS, {param: value}), param)


def test_a_bid_for_one_node_through_the_api_fills_only_there(nodes):
    n1, n2 = nodes
    buyer = funded_buyer()
    r = client_for(buyer).post("/api/v1/orders/", bid_body(price="3.00", gpus=2, node=n2.pk),
                               format="json")
    assert r.status_code == 201, r.content
    assert r.json()["node"] == n2.pk and r.json()["status"] == "filled"
    assert [f.ask.node_id for f in Fill.objects.all()] == [n2.pk]
    assert Order.objects.get(node=n1, side="ask").remaining_gpus == 8


def test_a_bid_for_an_unknown_node_is_a_400_naming_node_and_writes_nothing(nodes):
    buyer = funded_buyer()
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", bid_body(node=987_654), format="json")
    assert_refused(r, "node")
    assert snapshot(buyer) == before


def test_history_buckets_from_the_fills(nodes):
    _n1, _ = nodes
    placed = bid(funded_buyer(), price=1_000_000, gpus=2, duration_seconds=5400)
    at = (timezone.now() - timedelta(hours=3)).replace(second=0, microsecond=0)
    at = at.replace(minute=at.minute // 15 * 15) + timedelta(minutes=2)
    Fill.objects.filter(bid=placed.order).update(created_at=at)
    body = client_for().get(HISTORY, {"range": "24h"}).json()
    assert body["range"] == "24h" and body["bucket_seconds"] == 900
    assert len(body["buckets"]) == 96
    start = at - timedelta(minutes=2)
    b = next(x for x in body["buckets"]
             if datetime.fromisoformat(x["start"]).astimezone(UTC) == start)
    assert (b["open"], b["high"], b["low"], b["close"]) == ("1.000000",) * 4
    assert (b["trades"], b["gpus"], b["gpu_seconds"], b["gpu_hours"]) == (1, 2, 10800, "3")
    assert sum(x["trades"] for x in body["buckets"]) == 1
    empty = body["buckets"][0]
    assert empty["open"] is None and empty["gpu_hours"] == "0"


def test_history_bad_range_is_a_400_naming_range():
    assert_refused(client_for().get(HISTORY, {"range": "1y"}), "range")
    assert_refused(client_for().get(HISTORY, {"bucket": "1m"}), "bucket")
