"""A bid for one node through the ASGI fast path (marketplace/api/bid_batcher.py): the
batcher carries `node` as the DRF view does, and the bid fills only on that node."""

from __future__ import annotations

import pytest

from marketplace.api import bid_batcher
from marketplace.models import Fill, Order
from tests.factories import ask, bid_body, funded_buyer, registered_node
from tests.marketplace.api.test_bid_batcher import asgi_post, fresh_batcher, token_of  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_bid_for_one_node_through_the_batcher_fills_only_there():
    p1, n1, _ = registered_node(name="alpha", own_uuids=True)
    p2, n2, _ = registered_node(name="beta", own_uuids=True)
    ask(p1, n1, price=1_000_000, gpus=8)
    ask(p2, n2, price=2_000_000, gpus=4)
    buyer = funded_buyer()
    [placed, refused] = asgi_post((token_of(buyer), bid_body(price="3.00", node=n2.pk)),
                                  (token_of(buyer), bid_body(node=987_654)))
    assert placed.status_code == 201, placed.text
    assert placed.json()["node"] == n2.pk and placed.json()["status"] == "filled"
    assert [f.ask.node_id for f in Fill.objects.select_related("ask")] == [n2.pk]
    assert refused.status_code == 400 and "node" in refused.json()["errors"]
    assert bid_batcher.batcher().stats["bids"] >= 1
    assert Order.objects.filter(side="bid").count() == 1
