"""A bid the market's nodes could never fill is refused at POST /api/v1/orders/ (issue 13):
0 slices (400 naming `gpus`); a gang larger than the largest node of the market (409 naming
`gpus`, or `gang_size` when given, with that node's count; docs/MATCHING.md, "Gangs larger
than any node"). Nothing is written: no order, hold, journal entry or lease."""

from __future__ import annotations

import pytest

from tests.factories import H100, bid_body, funded_buyer, mig_node, registered_node
from tests.support.api import assert_refused, client_for, snapshot

pytestmark = pytest.mark.django_db

ONE_G = f"{H100}.1g.10gb"  # the recorded MIG H100 has 2 slices of it


def _refused(buyer, body, field, status, contains):
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", body, format="json")
    assert_refused(r, field, status=status, contains=contains)
    assert snapshot(buyer) == before  # nothing written, no hold


def test_a_bid_for_zero_slices_is_refused_naming_gpus():
    mig_node()
    _refused(funded_buyer(100), bid_body(gpu_class=ONE_G, gpus=0), "gpus", 400, "1")


def test_a_bid_for_more_slices_than_any_node_has_is_refused_with_the_largest_count():
    mig_node()
    buyer = funded_buyer(100)
    _refused(buyer, bid_body(gpu_class=ONE_G, gpus=3), "gpus", 409,
             f"the largest node of {ONE_G} has 2 MIG slices")
    _refused(buyer, bid_body(gpu_class=ONE_G, gpus=4, gang_size=4), "gpus", 409, "has 2")
    _refused(buyer, bid_body(gpu_class=ONE_G, gpus=6, gang_size=3), "gang_size", 409,
             "a gang of 3 runs on one node")
    # gangs that fit one node are taken, even when all of them together do not fit one
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpu_class=ONE_G, gpus=4,
                                                           gang_size=2), format="json")
    assert r.status_code == 201, r.content
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpu_class=ONE_G, gpus=2),
                               format="json")
    assert r.status_code == 201, r.content


def test_the_largest_node_counts_one_nodes_gpus_not_the_markets():
    for name in ("h100-a", "h100-b"):  # 8 H100s each
        registered_node(name=name, own_uuids=True)
    buyer = funded_buyer(100)
    _refused(buyer, bid_body(gpus=9), "gpus", 409, f"the largest node of {H100} has 8 GPUs")
    r = client_for(buyer).post("/api/v1/orders/", bid_body(gpus=16, gang_size=8),
                               format="json")
    assert r.status_code == 201, r.content


def test_a_market_without_nodes_lets_any_gang_rest():
    """No node to compare with: the bid rests until one registers (docs/MATCHING.md)."""
    mig_node()
    r = client_for(funded_buyer(100)).post(
        "/api/v1/orders/", bid_body(gpu_class=f"{H100}.7g.80gb", gpus=16), format="json")
    assert r.status_code == 201, r.content
