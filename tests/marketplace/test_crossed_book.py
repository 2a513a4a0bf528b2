"""A crossed book (a bid at or above the best ask) says why the bid rests, on the market
page and in the book API: what it needs that no offer meets."""

import pytest
from django.urls import reverse

from marketplace.selectors import crossed_note
from tests.factories import H100, ask, bid, funded_buyer, registered_node
from tests.support.api import client_for

pytestmark = pytest.mark.django_db
NOTE = "bids at or above the best ask rest: they need CUDA 12.4 / NVLink that no offer meets"


def test_a_crossed_book_says_the_bids_need_cuda_and_nvlink(client):
    provider, node, _ = registered_node()  # the dump's driver 535: CUDA 12.2
    placed = ask(provider, node, price=2_000_000, gpus=8)
    assert crossed_note(placed.order.market_id, 2_000_000) == ""  # no bid: not crossed
    buyer = funded_buyer(100)
    bid(buyer, price=2_500_000, gpus=1, min_cuda="12.4")
    bid(buyer, price=2_000_000, gpus=2, interconnect="nvlink", gang_size=2)
    bid(buyer, price=1_000_000, gpus=1, min_cuda="13.0")  # below the ask: not named
    html = client.get(reverse("market", args=[H100])).content.decode()
    assert f'id="crossed-note">{NOTE}.</p>' in html
    book = client_for().get(f"/api/v1/gpu-classes/{H100}/book/").json()
    assert book["note"] == NOTE and book["bids"][0]["price"] == "2.500000"


def test_an_uncrossed_book_has_no_note(client):
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000, gpus=8)
    bid(funded_buyer(100), price=1_500_000, gpus=1, min_cuda="12.4")
    assert "crossed-note" not in client.get(reverse("market", args=[H100])).content.decode()
    assert client_for().get(f"/api/v1/gpu-classes/{H100}/book/").json()["note"] == ""
