"""The bid and sealed-bid forms know what the nodes can run (marketplace/runtimes.py): their
command help is truthful (an empty command needs a node with Docker), says "needed" where
every node runs local processes, and a bid without a command there is refused next to the
command field, nothing written or held."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Order, SealedBid
from providers import services as provider_services
from settlement.models import Hold
from tests.factories import RTX4090_DUMP, ask, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login

pytestmark = pytest.mark.django_db
MARKET = "rtx-4090"


def _help(html: str, field: str) -> str:
    m = re.search(rf'id="id_{field}_helptext">(.*?)</span>', html, re.S)
    return m.group(1) if m else ""


@pytest.fixture
def process_node():
    user, node, _ = registered_node(RTX4090_DUMP, name="proc")
    provider_services.heartbeat_record(node=node, runtime="process", gpus=[])
    return user, node


def test_the_bid_forms_help_is_truthful_on_a_docker_market(client):
    login(client, funded_buyer())
    registered_node(RTX4090_DUMP, name="dock")  # runtime docker
    text = _help(client.get(reverse("market", args=[MARKET])).content.decode(), "command")
    assert "optional" not in text
    assert "image&#x27;s own" in text and "--runtime process" in text and "needs a command" in text


def test_a_bid_without_command_on_a_process_market_is_refused_next_to_command(
        client, process_node):
    user, node = process_node
    ask(user, node, market=MARKET)
    buyer = login(client, funded_buyer())
    page = client.get(reverse("market", args=[MARKET])).content.decode()
    assert _help(page, "command").startswith("needed: every node of rtx-4090 runs workloads")
    before = (Order.objects.count(), Hold.objects.filter(buyer=buyer).count())

    r = client.post(reverse("market", args=[MARKET]), {
        "gpus": "1", "hours": "1", "price": "3.00", "time_in_force": "GTC", "command": ""})

    assert r.status_code == 400
    assert "--runtime process" in field_error(r.content.decode(), "command")
    assert (Order.objects.count(), Hold.objects.filter(buyer=buyer).count()) == before
    r = client.post(reverse("market", args=[MARKET]), {
        "gpus": "1", "hours": "1", "price": "3.00", "time_in_force": "GTC",
        "command": "sleep 3600"})
    assert r.status_code == 302
    assert Order.objects.get(owner=buyer).status == "filled"


def test_a_sealed_bid_without_command_on_a_process_lot_is_refused_next_to_command(
        client, process_node):
    user, node = process_node
    lot = auctions.open_auction(provider_id=user.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    buyer = login(client, funded_buyer())
    page = client.get(reverse("auction", args=[lot.pk])).content.decode()
    assert _help(page, "command").startswith("needed: this lot&#x27;s node runs workloads")

    r = client.post(reverse("auction", args=[lot.pk]), {"price": "2.00", "command": ""})

    assert r.status_code == 400
    assert "--runtime process" in field_error(r.content.decode(), "command")
    assert not SealedBid.objects.filter(bidder=buyer).exists()
    assert not Hold.objects.filter(buyer=buyer).exists()
