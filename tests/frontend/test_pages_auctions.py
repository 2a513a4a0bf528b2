"""Sealed auctions through Django's test client: list, detail with countdown data, the
bid form, my bid, the result after close — and never another bidder's bid."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.models import SealedBid
from settlement.models import Hold
from tests.factories import funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login

pytestmark = pytest.mark.django_db

SECRET_PRICE = 7_777_777  # "7.777777": must never appear in another user's page


@pytest.fixture
def lot():
    provider, node, _ = registered_node()
    return auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                 reserve_price=2_000_000, duration_seconds=3600,
                                 closes_at=timezone.now() + timedelta(minutes=5))


@pytest.fixture
def rival(lot):
    user = funded_buyer(1000)
    auctions.place_sealed_bid(bidder_id=user.pk, auction_id=lot.pk, price=SECRET_PRICE)
    return user


def pages_for(client, lot):
    return "".join(client.get(url).content.decode() for url in (
        reverse("home"), reverse("auctions-page"), reverse("auction", args=[lot.pk]),
        reverse("portal") if client.session.get("_auth_user_id") else reverse("home")))


def test_list_and_detail_render(client, lot, rival):
    html = client.get(reverse("auctions-page")).content.decode()
    assert f'href="{reverse("auction", args=[lot.pk])}"' in html
    r = client.get(reverse("auction", args=[lot.pk]))
    html = r.content.decode()
    assert r.status_code == 200 and 'data-closes-at="' in html and 'id="countdown"' in html
    assert 'id="bid-count">1<' in html
    assert "Log in" in html


def test_place_my_bid_and_see_only_mine(client, lot, rival):
    me = login(client, funded_buyer(1000))
    html = client.get(reverse("auction", args=[lot.pk])).content.decode()
    assert '<label for="id_price"' in html and '<label for="id_min_gpus"' in html
    r = client.post(reverse("auction", args=[lot.pk]), {"price": "3.00"})
    assert r.status_code == 302
    html = client.get(reverse("auction", args=[lot.pk])).content.decode()
    assert "$3.00" in html and 'id="bid-count">2<' in html
    assert "7.77" not in pages_for(client, lot)
    assert SealedBid.objects.get(bidder=me).price == 3_000_000


@pytest.mark.parametrize(("price", "words"), [("1.00", "reserve"), ("abc", "decimal"),
                                              ("2.0000001", "6 decimal")])
def test_bad_sealed_bid_error_next_to_field_and_nothing_written(client, lot, price, words):
    login(client, funded_buyer(1000))
    holds = Hold.objects.count()
    r = client.post(reverse("auction", args=[lot.pk]), {"price": price})
    assert r.status_code == 400
    assert words in field_error(r.content.decode(), "price")
    assert not SealedBid.objects.exists() and Hold.objects.count() == holds


def test_bid_without_funds(client, lot):
    login(client, funded_buyer(1))
    r = client.post(reverse("auction", args=[lot.pk]), {"price": "3.00"})
    assert r.status_code == 400 and "insufficient balance" in r.content.decode()
    assert not SealedBid.objects.exists()


def test_provider_sees_count_not_content(client, lot, rival):
    login(client, lot.provider)
    html = pages_for(client, lot)
    assert "your own lot" in html and "7.77" not in html
    assert client.post(reverse("auction", args=[lot.pk]), {"price": "9.00"}).status_code == 400


def test_withdraw(client, lot):
    me = login(client, funded_buyer(1000))
    bid = auctions.place_sealed_bid(bidder_id=me.pk, auction_id=lot.pk, price=2_500_000)
    r = client.post(reverse("sealed-bid-withdraw-page", args=[bid.pk]))
    assert r.status_code == 302
    bid.refresh_from_db()
    assert bid.status == "withdrawn"


def test_result_after_close_is_anonymous(client, lot, rival):
    me = login(client, funded_buyer(1000))
    auctions.place_sealed_bid(bidder_id=me.pk, auction_id=lot.pk, price=3_000_000)
    auctions.close_auction(auction_id=lot.pk, now=lot.closes_at + timedelta(seconds=1))
    html = client.get(reverse("auction", args=[lot.pk])).content.decode()
    assert 'id="clearing-price">$3.00 /GPU-h<' in html  # second price: the rival pays my bid
    assert "lost" in html
    assert rival.username not in html and "7.77" not in html
    assert "Submit sealed bid" not in html
