"""The bid terms of the API in the pages' bid forms (frontend/forms_terms.py): the market
page's bid and the sealed bid take checkpoint (against moto's S3 server, credentials
enforced: tests/support/s3.py), failover, notice_signal, stop_grace_seconds and
min_reliability; a bad value is a 400 with the error on its field, nothing written, and
the checkpoint's credentials are never rendered back into the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions, book, sealing
from marketplace.models import Lease, Order, SealedBid
from settlement.models import Hold
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.test_pages_buyer import field_error, login

pytestmark = pytest.mark.django_db
MARKET = "h100-sxm-80gb"
BID = {"gpus": "1", "hours": "1", "price": "0.50", "time_in_force": "GTC",
       "interconnect": "any"}


@pytest.fixture(autouse=True)
def _private_endpoints_allowed(settings):
    settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE = True  # moto listens on 127.0.0.1


@pytest.fixture
def store(s3_server):
    bucket = s3_server.bucket("ckpt-pages")
    return {"checkpoint_url": f"s3://{bucket}/runs",
            "checkpoint_endpoint_url": s3_server.endpoint_url,
            "checkpoint_access_key_id": s3_server.access_key_id,
            "checkpoint_secret_access_key": s3_server.secret_access_key}


@pytest.fixture
def lot():
    provider, node, _ = registered_node()
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                 reserve_price=2_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


def test_the_market_page_bid_takes_every_term(client, store):
    buyer = login(client, funded_buyer(100))
    html = client.get(reverse("market", args=[MARKET])).content.decode()
    for name in ("failover", "notice_signal", "stop_grace_seconds", "checkpoint_url",
                 "checkpoint_endpoint_url", "node", "min_reliability"):
        assert f'name="{name}"' in html
    assert 'type="password" name="checkpoint_secret_access_key"' in html
    r = client.post(reverse("market", args=[MARKET]), {
        **BID, **store, "failover": "no", "notice_signal": "SIGUSR1",
        "stop_grace_seconds": "45", "min_reliability": "0.9"})
    assert r.status_code == 302, field_error(r.content.decode(), "checkpoint_url")
    order = Order.objects.get(side="bid", owner=buyer)
    assert (order.failover, order.notice_signal, order.stop_grace_seconds) == \
        (False, "SIGUSR1", 45)
    assert order.checkpoint["url"] == store["checkpoint_url"]
    secret = store["checkpoint_secret_access_key"]
    assert secret not in str(order.checkpoint)
    assert sealing.unseal(order.checkpoint_sealed)["secret_access_key"] == secret


def test_the_defaults_are_the_apis(client):
    buyer = login(client, funded_buyer(100))
    assert client.post(reverse("market", args=[MARKET]), BID).status_code == 302
    order = Order.objects.get(side="bid", owner=buyer)
    assert (order.failover, order.notice_signal, order.stop_grace_seconds) == (True, "", 10)
    assert not order.checkpoint


@pytest.mark.parametrize(("field", "value"), [
    ("stop_grace_seconds", "301"), ("stop_grace_seconds", "ten"),
    ("notice_signal", "SIGKILL"), ("failover", "maybe"), ("min_reliability", "-0.1"),
    ("checkpoint_url", "http://not-s3/x"), ("node", "0"),
    ("image", "127.0.0.1:5000/x:1"),  # a loopback registry (docs/IMAGES.md)
])
def test_a_bad_term_is_refused_on_its_field(client, field, value):
    login(client, funded_buyer(100))
    r = client.post(reverse("market", args=[MARKET]), {**BID, field: value})
    assert r.status_code == 400 and field_error(r.content.decode(), field)
    assert not Order.objects.filter(side="bid").exists() and not Hold.objects.exists()


def test_wrong_checkpoint_credentials_are_refused_and_never_echoed(client, store):
    login(client, funded_buyer(100))
    wrong = {**store, "checkpoint_access_key_id": "AKIAWRONGWRONGWRONG1",
             "checkpoint_secret_access_key": "wrong-secret-never-shown-0123456789"}
    r = client.post(reverse("market", args=[MARKET]), {**BID, **wrong})
    html = r.content.decode()
    assert r.status_code == 400 and field_error(html, "checkpoint_url")
    assert "wrong-secret-never-shown" not in html and "AKIAWRONGWRONGWRONG1" not in html
    assert wrong["checkpoint_url"] in html  # the bucket stays, to correct
    # a checkpoint's other field without its url names the url
    r = client.post(reverse("market", args=[MARKET]),
                    {**BID, "checkpoint_secret_access_key": "s3cr3t-alone-xyz"})
    html = r.content.decode()
    assert r.status_code == 400 and "is required" in field_error(html, "checkpoint_url")
    assert "s3cr3t-alone-xyz" not in html
    assert not Order.objects.filter(side="bid").exists() and not Hold.objects.exists()


def test_a_bid_for_one_node_fills_there(client):
    """The cheaper ask is on another node: the bid for `node` fills on node only."""
    nodes = []
    for name, price in (("cheaper", 500_000), ("only-here", 1_000_000)):
        provider, node, _ = registered_node(name=name, own_uuids=True)
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=price, gpus=8, available_until=in_a_day())
        nodes.append(node)
    buyer = login(client, funded_buyer(100))
    r = client.post(reverse("market", args=[MARKET]), {**BID, "price": "2.00",
                                                       "node": str(nodes[1].pk)})
    assert r.status_code == 302
    assert Order.objects.get(side="bid", owner=buyer).node_id == nodes[1].pk
    assert Lease.objects.get(buyer=buyer).node_id == nodes[1].pk


def test_the_sealed_bid_takes_the_terms(client, lot, store):
    buyer = login(client, funded_buyer(1000))
    html = client.get(reverse("auction", args=[lot.pk])).content.decode()
    assert 'name="stop_grace_seconds"' in html and 'name="checkpoint_url"' in html
    r = client.post(reverse("auction", args=[lot.pk]), {
        "price": "3.00", **store, "failover": "no", "notice_signal": "SIGINT",
        "stop_grace_seconds": "0", "min_reliability": "0.5"})
    assert r.status_code == 302
    bid = SealedBid.objects.get(bidder=buyer)
    assert (bid.failover, bid.notice_signal, bid.stop_grace_seconds) == (False, "SIGINT", 0)
    assert str(bid.min_reliability) == "0.500"
    assert bid.checkpoint["url"] == store["checkpoint_url"]


@pytest.mark.parametrize(("field", "value"), [("stop_grace_seconds", "-1"),
                                         ("notice_signal", "KILL"),
                                         ("checkpoint_endpoint_url", "ftp://x"),
                                         ("image", "[::1]:5000/x")])
def test_a_bad_sealed_bid_term_is_refused_on_its_field(client, lot, field, value):
    login(client, funded_buyer(1000))
    form = {"price": "3.00", field: value}
    if field.startswith("checkpoint"):
        form |= {"checkpoint_url": "s3://bucket/p", "checkpoint_access_key_id": "k",
                 "checkpoint_secret_access_key": "sealed-secret-xyz"}
    r = client.post(reverse("auction", args=[lot.pk]), form)
    html = r.content.decode()
    assert r.status_code == 400 and field_error(html, field)
    assert "sealed-secret-xyz" not in html
    assert not SealedBid.objects.exists()
