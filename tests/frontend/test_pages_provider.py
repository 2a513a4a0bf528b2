"""Provider portal through Django's test client: onboarding, nodes and their runner
token (shown once), GPUs and health, asks, sealed auctions, leases, earnings."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from marketplace import book, lease_end, leases
from marketplace.models import Auction, Order
from providers.models import Node, Provider, hash_token
from tests.factories import UserFactory, funded_buyer, in_a_day, registered_node
from tests.frontend.test_pages_buyer import MARKET, field_error, login

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(client):
    user, node, _ = registered_node()
    login(client, user)
    return user, node


def test_portal_onboarding(client):
    user = login(client, UserFactory())
    html = client.get(reverse("portal")).content.decode()
    assert "Become a provider" in html and '<label for="id_display_name"' in html
    r = client.post(reverse("portal-onboard"), {"display_name": "   "})
    assert r.status_code == 400 and field_error(r.content.decode(), "display_name")
    assert not Provider.objects.filter(user=user).exists()
    r = client.post(reverse("portal-onboard"), {"display_name": "Acme GPUs"})
    assert r.status_code == 302
    assert Provider.objects.get(user=user).display_name == "Acme GPUs"
    html = client.get(reverse("portal")).content.decode()
    assert '<label for="id_name"' in html and "No node yet" in html


def test_add_node_shows_token_once_with_commands(client):
    user = login(client, UserFactory())
    client.post(reverse("portal-onboard"), {"display_name": "Acme"})
    r = client.post(reverse("node-add"), {"name": "box-1"})
    assert r.status_code == 201 and r["Cache-Control"] == "no-store"
    html = r.content.decode()
    node = Node.objects.get(provider__user=user, name="box-1")
    token = re.search(r'id="runner-token"[^>]*value="([^"]+)"', html).group(1)
    assert hash_token(token) == node.token_hash
    assert f"gpumarket-runner register --url http://testserver --token {token}" in html
    assert "gpumarket-runner run" in html
    # never again: not on the portal, not on the node page
    assert token not in client.get(reverse("portal")).content.decode()
    assert token not in client.get(reverse("node", args=[node.pk])).content.decode()


def test_duplicate_node_name_error_next_to_field(client, provider):
    _, node = provider
    r = client.post(reverse("node-add"), {"name": node.name})
    assert r.status_code == 400 and "already have a node" in field_error(r.content.decode(), "name")
    assert Node.objects.count() == 1


def test_node_needs_a_provider(client):
    login(client, UserFactory())
    assert client.post(reverse("node-add"), {"name": "x"}).status_code == 404
    assert not Node.objects.exists()


def test_node_page_lists_real_gpus_and_health(client, provider):
    from providers.services import heartbeat_record

    _, node = provider
    gpus = list(node.gpus.all())
    heartbeat_record(node=node, runtime="docker", gpus=[{"uuid": g.uuid} for g in gpus],
                     findings=[{"uuid": gpus[0].uuid, "severity": "fatal", "rule": "xid",
                                "evidence": "GPU has fallen off the bus"}])
    html = client.get(reverse("node", args=[node.pk])).content.decode()
    assert html.count("NVIDIA H100 80GB HBM3") == 8
    assert html.count('class="healthy"') == 7 and "unhealthy since" in html
    assert "GPU has fallen off the bus" in html and "535.183.01" in html
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None


def test_other_providers_node_is_404(client, provider):
    from tests.factories import RTX4090_DUMP

    _, other_node, _ = registered_node(RTX4090_DUMP, name="theirs")
    assert client.get(reverse("node", args=[other_node.pk])).status_code == 404


def test_place_ask_from_the_portal(client, provider):
    _, node = provider
    r = client.post(reverse("ask-add"), {"node": node.pk, "gpus": "4", "price": "2.10",
                                         "available_hours": "24"})
    assert r.status_code == 302
    ask = Order.objects.get(side="ask")
    assert (ask.gpus, ask.price, ask.node_id) == (4, 2_100_000, node.pk)
    assert f'id="order-{ask.pk}"' in client.get(reverse("portal")).content.decode()


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"gpus": "9"}, "gpus", ""),  # more than the node's 8 free GPUs: the service says so
    ({"price": "1.0000001"}, "price", "6 decimal"),
    ({"node": "999999"}, "node", ""),
    ({"available_hours": "0"}, "available_hours", ""),
])
def test_bad_ask_error_next_to_field_and_nothing_written(client, provider, data, field, words):
    _, node = provider
    form = {"node": node.pk, "gpus": "2", "price": "2.00", "available_hours": "24", **data}
    r = client.post(reverse("ask-add"), form)
    assert r.status_code == 400
    error = field_error(r.content.decode(), field)
    assert error and words in error
    assert not Order.objects.exists()


def test_open_auction_from_the_portal_and_bad_reserve(client, provider):
    _, node = provider
    r = client.post(reverse("auction-add"), {"node": node.pk, "gpus": "8", "reserve_price": "x",
                                             "hours": "1", "rule": "second_price",
                                             "closes_in_minutes": "5"})
    assert r.status_code == 400 and field_error(r.content.decode(), "reserve_price")
    assert not Auction.objects.exists()
    r = client.post(reverse("auction-add"), {"node": node.pk, "gpus": "8",
                                             "reserve_price": "2.00", "hours": "1",
                                             "rule": "uniform_price", "closes_in_minutes": "5"})
    lot = Auction.objects.get()
    assert r.status_code == 302 and r.url == reverse("auction", args=[lot.pk])
    assert lot.rule == "uniform_price" and lot.reserve_price == 2_000_000


def test_payout_address(client, provider):
    r = client.post(reverse("payout-address"), {"address": "0x123"})
    assert r.status_code == 400 and field_error(r.content.decode(), "address")
    addr = "0x" + "ab" * 20
    assert client.post(reverse("payout-address"), {"address": addr}).status_code == 302
    assert "0xaBAb" in client.get(reverse("portal")).content.decode() or \
        addr.lower() in client.get(reverse("portal")).content.decode().lower()


def test_leases_on_my_gpus_and_earnings_split(client, provider):
    user, node = provider
    book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=MARKET, price=3_330_000,
                   gpus=8, available_until=in_a_day())
    buyer = funded_buyer(100)
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_330_000, gpus=1,
                            duration_seconds=3600)
    lease = placed.leases[0]
    leases.mark_running(lease=lease, container_id="abc123")
    html = client.get(reverse("portal")).content.decode()
    assert f'id="lease-{lease.pk}"' in html and "running" in html
    from datetime import timedelta

    from django.utils import timezone
    lease_end.end_lease(lease_id=lease.pk, status="completed", cause="time is up",
                        now=timezone.now() + timedelta(seconds=100))
    lease.refresh_from_db()
    assert lease.cost and lease.provider_amount + lease.platform_fee == lease.cost
    assert lease.platform_fee == lease.cost * 1500 // 10000
    r = client.get(reverse("earnings"))
    assert r.status_code == 200
    html = r.content.decode()
    from frontend.views import usd
    for amount in (lease.cost, lease.provider_amount, lease.platform_fee):
        assert usd(amount) in html
    assert "earnings-chart" in html and '"cumulative":' in html


def test_node_page_lists_mig_slices_with_their_gpus_health(client):
    from providers.services import heartbeat_record
    from tests.factories import H100_MIG, mig_node

    user, node, _ = mig_node()
    login(client, user)
    parent = H100_MIG.gpus[0].uuid
    heartbeat_record(node=node, runtime="docker", gpus=[{"uuid": parent, "temperature_c": 41}],
                     findings=[{"uuid": parent, "severity": "fatal", "rule": "xid",
                                "evidence": "GPU has fallen off the bus"}])
    html = client.get(reverse("node", args=[node.pk])).content.decode()
    for dev in H100_MIG.gpus[0].mig_devices:
        assert dev.uuid in html and f"h100-sxm-80gb.{dev.profile}" in html
    assert parent not in html  # the GPU itself is not a unit of the node
    assert html.count("GPU has fallen off the bus") == 4  # each slice carries its GPU's finding
    assert html.count('<td class="num">41</td>') == 4  # the GPU's temperature on each slice
