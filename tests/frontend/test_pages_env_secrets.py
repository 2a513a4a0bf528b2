"""Env and secrets on the bid and sealed-bid forms: NAME=VALUE lines, checked by the API's
own field (the same names and messages); a secret is sealed as through the API, shown by
name only, and never rendered back into a form shown again after an error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.models import Order, SealedBid
from marketplace.sealing import unseal
from tests.factories import H100, ask, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.frontend.test_pages_templates import BID
from tests.support.api import snapshot

pytestmark = pytest.mark.django_db
SECRET = "hf_s3cret-value-never-shown"
IMAGE = "gpumarket/busybox:local"


def test_a_page_bid_carries_env_and_sealed_secrets_as_the_api_does(client):
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000, gpus=2)
    buyer = login(client, funded_buyer(10))
    r = client.post(reverse("market", args=[H100]),
                    {**BID, "image": IMAGE, "env": "EPOCHS=3\r\n\r\nLR=3e-4=x",
                     "secrets": f"HF_TOKEN={SECRET}"})
    assert r.status_code == 302, r.content.decode()[:2000]
    order = Order.objects.get(owner=buyer)
    assert order.env == {"EPOCHS": "3", "LR": "3e-4=x"}
    assert unseal(order.secrets_sealed) == {"HF_TOKEN": SECRET}
    page = client.get(reverse("market", args=[H100])).content.decode()
    assert SECRET not in page


@pytest.mark.parametrize(("data", "field", "says"), [
    ({"env": "lower=1"}, "env", "is not a name"),
    ({"env": "JUST_A_NAME"}, "env", "line 1 is not NAME=VALUE"),
    ({"env": "A=1\nA=2"}, "env", "A is given twice"),
    ({"secrets": f"GPUMARKET_X={SECRET}"}, "secrets", "secrets.GPUMARKET_X"),
    ({"secrets": SECRET}, "secrets", "line 1 is not NAME=VALUE"),
    ({"env": "HF=1", "secrets": f"HF={SECRET}"}, "secrets", "is in env too"),
    ({"ports": "abc"}, "ports", "TCP port"),  # another field's error: secrets not echoed
])
def test_bad_env_or_secrets_are_refused_by_field_and_the_secret_never_echoed(
        client, data, field, says):
    provider, node, _ = registered_node()
    ask(provider, node, price=2_000_000, gpus=2)
    buyer = login(client, funded_buyer(10))
    before = snapshot(buyer)
    r = client.post(reverse("market", args=[H100]),
                    {**BID, "image": IMAGE, "secrets": f"HF_TOKEN={SECRET}", **data})
    assert r.status_code == 400
    html = r.content.decode()
    assert says in field_error(html, field), field_error(html, field)
    assert SECRET not in html  # the form comes back with its secrets field empty
    assert 'name="secrets"' in html
    assert snapshot(buyer) == before


def test_a_sealed_bid_from_the_page_carries_env_and_secrets(client):
    provider, node, _ = registered_node()
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    buyer = login(client, funded_buyer(100))
    url = reverse("auction", args=[auction.pk])
    sealed = {"price": "1.50", "gpus": "", "min_gpus": "", "image": IMAGE, "command": "",
              "ports": "", "min_cuda": "", "ssh": "", "env": "EPOCHS=3",
              "secrets": f"HF_TOKEN={SECRET}"}
    r = client.post(url, {**sealed, "price": "x"})
    assert r.status_code == 400 and SECRET not in r.content.decode()
    r = client.post(url, sealed)
    assert r.status_code == 302
    bid = SealedBid.objects.get(bidder=buyer)
    assert bid.env == {"EPOCHS": "3"} and unseal(bid.secrets_sealed) == {"HF_TOKEN": SECRET}
    assert SECRET not in client.get(url).content.decode()
