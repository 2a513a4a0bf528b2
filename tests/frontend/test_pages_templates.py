"""Templates on the pages: the market page says per template how many nodes with asks can
run it ("needs CUDA 12.4: 1 of 2 nodes with asks qualify"); the bid and sealed-bid forms
offer the templates first (a select), then the own-image fields; a template bid from the
page is stored as the API stores it, and a refusal is shown next to the field it names
with nothing written."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Order, SealedBid
from tests.factories import H100, ask, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import snapshot

pytestmark = pytest.mark.django_db
BID = {"gpus": "1", "hours": "1", "price": "2.50", "gang_size": "", "time_in_force": "GTC",
       "image": "", "command": "", "ports": "", "min_cuda": "", "ssh": ""}


def _two_nodes():
    provider, old, _ = registered_node(name="old", cuda_version="12.2", own_uuids=True)
    _, new, _ = registered_node(name="new", cuda_version="12.6", own_uuids=True, user=provider)
    ask(provider, old, price=2_000_000, gpus=2)
    ask(provider, new, price=2_100_000, gpus=2)
    return provider


def _rows(html: str) -> dict[str, str]:
    """Template id → its "Nodes" cell on the market page."""
    return dict(re.findall(r'data-template="([^"]+)".*?class="cuda-note">([^<]*)<', html, re.S))


def test_market_page_shows_per_template_how_many_nodes_qualify(client):
    _two_nodes()
    html = client.get(reverse("market", args=[H100])).content.decode()
    rows = _rows(html)
    assert rows["pytorch-jupyter"] == "needs CUDA 12.4: 1 of 2 nodes with asks qualify"
    assert rows["cuda-ssh"] == rows["vllm"] == rows["pytorch-jupyter"]
    assert rows["custom"] == "runs on any node (2 with asks)"
    assert "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime" in html


def test_the_bid_form_offers_the_templates_first_then_own_image(client):
    login(client, funded_buyer(10))
    html = client.get(reverse("market", args=[H100])).content.decode()
    form = html[html.index('id="bid-form"'):]
    names = re.findall(r'name="(\w+)"', form)
    assert names.index("template") < names.index("gpus") < names.index("image")
    options = re.findall(r'<option value="([^"]*)"', form[form.index('name="template"'):])
    assert options[:4] == ["cuda-ssh", "pytorch-jupyter", "vllm", ""]
    assert re.search(r'<option value="" selected>Own image', form)  # unless one is picked
    assert "needs CUDA 12.4" in form


def test_a_template_bid_from_the_page_fills_on_the_qualifying_node(client):
    _two_nodes()
    buyer = login(client, funded_buyer(10, ssh_key=True))
    r = client.post(reverse("market", args=[H100]),
                    {**BID, "template": "pytorch-jupyter", "image": "gpumarket/busybox:local"})
    assert r.status_code == 302, field_error(r.content.decode(), "template")
    order = Order.objects.get(owner=buyer)
    assert order.template == "pytorch-jupyter" and order.image == "gpumarket/busybox:local"
    assert order.ports == [22, 8888] and order.port_roles == {"22": "ssh", "8888": "jupyter"}
    assert order.min_cuda == "12.4" and order.ssh is True
    [fill] = order.bid_fills.all()
    assert fill.ask.node.name == "new"


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"template": "nope"}, "template", "known templates are"),
    ({"template": "custom"}, "image", "give one"),
    ({"template": "cuda-ssh", "min_cuda": "11.8"}, "min_cuda", "needs CUDA 12.4"),
    ({"template": "", "min_cuda": "twelve"}, "min_cuda", "MAJOR.MINOR"),
    ({"template": "pytorch-jupyter", "ports": "8888"}, "ports", "22 (ssh)"),
    ({"template": "", "ssh": "maybe"}, "ssh", "true or false"),
])
def test_a_bad_template_bid_on_the_page_is_refused_next_to_its_field(client, data, field,
                                                                      words):
    _two_nodes()
    buyer = login(client, funded_buyer(10))
    before = snapshot(buyer)
    r = client.post(reverse("market", args=[H100]), {**BID, **data})
    assert r.status_code == 400
    assert words in field_error(r.content.decode(), field)
    assert snapshot(buyer) == before


def test_the_sealed_bid_form_offers_templates_and_refuses_one_the_node_cannot_run(client):
    provider, node, _ = registered_node(cuda_version="12.2")
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    buyer = login(client, funded_buyer(100, ssh_key=True))
    url = reverse("auction", args=[auction.pk])
    html = client.get(url).content.decode()
    assert 'name="template"' in html and "CUDA 12.2" in html
    sealed = {"price": "1.50", "gpus": "", "min_gpus": "", "image": "", "command": "",
              "ports": "", "min_cuda": "", "ssh": ""}
    before = snapshot(buyer)
    r = client.post(url, {**sealed, "template": "cuda-ssh"})
    assert r.status_code == 400
    assert "CUDA 12.2" in field_error(r.content.decode(), "min_cuda")
    assert snapshot(buyer) == before
    r = client.post(url, {**sealed, "template": "cuda-ssh", "image": "gpumarket/busybox:local",
                          "min_cuda": "12.2"})
    assert r.status_code == 302
    bid = SealedBid.objects.get(bidder=buyer)
    assert bid.template == "cuda-ssh" and bid.port_roles == {"22": "ssh"}
