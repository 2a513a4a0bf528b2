"""Failover on the pages (issue 15): the offers table's reliability column, the bid form's
min_reliability (refused out of 0–1, naming the field), the leases page's chain story and
fault credit, the node page's reliability record."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import book, failover
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from marketplace.models import Order
from providers.models import Node
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.test_pages_buyer import field_error, login

pytestmark = pytest.mark.django_db
MARKET = "h100-sxm-80gb"


def test_offers_show_reliability_and_the_bid_form_takes_min_reliability(client):
    provider, node, _ = registered_node(name="n1", own_uuids=True)
    Node.objects.filter(pk=node.pk).update(reliability=Decimal("0.975"))
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=1_000_000, gpus=8, available_until=in_a_day())
    login(client, funded_buyer(100))
    html = client.get(reverse("market", args=[MARKET])).content.decode()
    assert "Reliability (30 days)" in html and ">0.975<" in html
    form = {"gpus": "1", "hours": "1", "price": "0.50", "time_in_force": "GTC",
            "interconnect": "any"}
    r = client.post(reverse("market", args=[MARKET]), {**form, "min_reliability": "1.5"})
    assert r.status_code == 400 and field_error(r.content.decode(), "min_reliability")
    assert not Order.objects.filter(side="bid").exists()
    r = client.post(reverse("market", args=[MARKET]), {**form, "min_reliability": "0.99"})
    assert r.status_code == 302
    assert Order.objects.get(side="bid").min_reliability == Decimal("0.99")


def test_the_leases_page_tells_the_chain_and_the_credit(client):
    prov_a, node_a, _ = registered_node(name="node-a", own_uuids=True)
    prov_b, node_b, _ = registered_node(name="node-b", own_uuids=True)
    for prov, node in ((prov_a, node_a), (prov_b, node_b)):
        book.place_ask(provider_id=prov.pk, node_id=node.pk, market_slug=None,
                       price=2_000_000, gpus=1, available_until=in_a_day())
    buyer = login(client, funded_buyer(100))
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_000_000, gpus=1,
                             duration_seconds=3600).leases
    lease = mark_running(lease=lease, container_id="c" * 64,
                         now=timezone.now() - timedelta(seconds=900))
    uuid = lease.lease_gpus.first().gpu.uuid
    failed = end_lease(lease_id=lease.pk, status="failed",
                       cause=f"GPU {uuid}: gpu_lost: the GPU no longer answers",
                       detail={"runner_usage_seconds": 600})
    failover.continue_lease(lease_id=failed.pk)
    html = client.get(reverse("leases-page")).content.decode()
    assert f"lease {failed.pk} failed on node {failed.node.name} (GPU " in html
    assert "; continued as lease" in html
    assert "provider&#x27;s fault: credited" in html or "provider's fault: credited" in html
    login(client, prov_a)
    html = client.get(reverse("node", args=[failed.node_id])).content.decode()
    assert 'id="reliability"' in html and "Failed by the provider" in html
