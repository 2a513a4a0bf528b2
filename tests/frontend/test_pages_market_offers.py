"""The market page without JavaScript: the offers table filtered and sorted by the query
string, a bad filter shown naming the parameter, "Bid for this node" filling in the bid
form, that bid filling only on its node, and the price history's data."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace.models import Fill, Order
from tests.factories import H100, ask, bid, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import login

pytestmark = pytest.mark.django_db
URL = reverse("market", args=[H100])


@pytest.fixture
def nodes():
    p1, n1, _ = registered_node(name="alpha", own_uuids=True)
    p2, n2, _ = registered_node(name="beta", own_uuids=True, cuda_version="12.4")
    n2.provider.display_name = "Bolt"
    n2.provider.save()
    ask(p1, n1, price=1_000_000, gpus=8)
    ask(p2, n2, price=2_000_000, gpus=4)
    return n1, n2


def _rows(html: str) -> list[str]:
    body = re.search(r'<tbody id="offer-rows">(.*?)</tbody>', html, re.S).group(1)
    return re.findall(r'<td class="offer-node" title="[^"]*">([^<]*)</td>', body)


def test_the_offers_table_lists_each_ask_sorted_and_filtered_by_the_query(client, nodes):
    html = client.get(URL).content.decode()
    assert _rows(html) == ["alpha", "beta"]
    assert "Acme" in html and "Bolt" in html and "/ 989.4" in html
    assert _rows(client.get(URL, {"sort": "-price"}).content.decode()) == ["beta", "alpha"]
    assert _rows(client.get(URL, {"min_gpus": "5"}).content.decode()) == ["alpha"]
    assert _rows(client.get(URL, {"min_cuda": "12.3", "provider": "bolt"})
                 .content.decode()) == ["beta"]
    sorted_html = client.get(URL, {"sort": "price"}).content.decode()
    assert 'href="?sort=-price#offers-h"' in sorted_html  # the column toggles its direction


def test_a_bad_filter_is_a_400_page_naming_the_parameter(client, nodes):
    r = client.get(URL, {"max_price": "cheap"})
    assert r.status_code == 400
    html = r.content.decode()
    assert re.search(r'id="offer-filter-error"[^>]*><li>max_price: ', html)
    assert _rows(html) == ["alpha", "beta"]  # unfiltered, never a 500


def test_bid_for_this_node_fills_in_the_form_and_fills_only_there(client, nodes):
    _, n2 = nodes
    buyer = funded_buyer()
    login(client, buyer)
    html = client.get(URL, {"node": str(n2.pk), "min_gpus": "3"}).content.decode()
    assert f'href="?min_gpus=3&amp;node={n2.pk}#bid-h"' in html  # the filters kept
    assert re.search(rf'name="node"[^>]*value="{n2.pk}"', html)
    assert re.search(r'name="price"[^>]*value="2.00"', html)
    r = client.post(URL, {"gpus": "2", "hours": "1", "price": "3.00", "gang_size": "",
                          "time_in_force": "GTC", "node": str(n2.pk), "template": "",
                          "image": "gpumarket/busybox:local", "command": "sleep 1"})
    assert r.status_code == 302, r.content.decode()[:2000]
    order = Order.objects.get(side="bid")
    assert order.node_id == n2.pk and order.status == "filled"
    assert [f.ask.node_id for f in Fill.objects.all()] == [n2.pk]


def test_the_price_history_data_has_the_ranges_buckets(client, nodes):
    placed = bid(funded_buyer(), price=1_000_000, gpus=1)
    Fill.objects.filter(bid=placed.order).update(created_at=timezone.now() - timedelta(minutes=5))
    html = client.get(URL, {"range": "1h"}).content.decode()
    data = json.loads(re.search(r'<script id="history-data" type="application/json">(.*?)'
                                r"</script>", html, re.S).group(1))
    assert data["range"] == "1h" and len(data["buckets"]) == 60
    traded = [b for b in data["buckets"] if b["trades"]]
    assert [(b["close"], b["gpu_hours"]) for b in traded] == [("1.00", "1")]


def test_an_image_shows_which_offers_nodes_hold_it_and_a_bad_one_is_named(client, nodes):
    from providers.models import NodeImage

    n1, _n2 = nodes
    NodeImage.objects.create(node=n1, image="registry.example/team/train:1", bytes=10**9,
                             reported_at=timezone.now())
    html = client.get(URL, {"image": "registry.example/team/train:1"}).content.decode()
    assert re.search(r'id="image-note"[^>]*>image cached on 1 of 2 nodes<', html), html
    body = re.search(r'<tbody id="offer-rows">(.*?)</tbody>', html, re.S).group(1)
    rows = re.findall(r"<tr .*?</tr>", body, re.S)
    assert ["image cached" in row for row in rows] == [True, False]  # alpha, beta
    assert "image=registry.example%2Fteam%2Ftrain%3A1" in rows[0]  # the bid link keeps it
    r = client.get(URL, {"image": "Not An Image!"})
    assert r.status_code == 400
    assert re.search(r'id="offer-filter-error"[^>]*><li>image: ', r.content.decode())
    assert "image cached" not in client.get(URL).content.decode()
    twice = client.get(URL + "?image=a%2Fb%3A1&image=c%2Fd%3A1")
    assert twice.status_code == 400 and "image: is given more than once" in twice.content.decode()
    nul = client.get(URL + "?image=a%00b")
    assert nul.status_code == 400 and "\x00" not in nul.content.decode()
