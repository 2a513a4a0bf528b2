"""Env and secrets through the bid batcher (the ASGI fast path of POST /api/v1/orders/):
the same answer as the DRF view — secret names, never values — and the same refusals."""

from __future__ import annotations

import pytest

from marketplace import sealing
from marketplace.api import bid_batcher
from marketplace.models import Order
from settlement.models import Hold
from tests.factories import funded_buyer
from tests.marketplace.api.test_bid_batcher import BID, asgi_post, fresh_batcher, token_of  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "batcher-secret-0e1d5c"


def test_the_fast_path_seals_secrets_and_names_them_only():
    buyer = funded_buyer(100)
    token = token_of(buyer)
    placed, refused = asgi_post(
        (token, {**BID, "env": {"MODE": "x"}, "secrets": {"HF_TOKEN": SECRET}}),
        (token, {**BID, "secrets": {"NVIDIA_DRIVER": SECRET}}))
    assert bid_batcher.batcher().stats["bids"] >= 1
    assert placed.status_code == 201, placed.text
    assert placed.json()["secret_names"] == ["HF_TOKEN"] and placed.json()["env"] == {"MODE": "x"}
    assert SECRET not in placed.text
    order = Order.objects.get()
    assert SECRET not in order.secrets_sealed
    assert sealing.unseal(order.secrets_sealed) == {"HF_TOKEN": SECRET}
    assert refused.status_code == 400 and "secrets.NVIDIA_DRIVER" in refused.json()["errors"]
    assert SECRET not in refused.text
    assert Hold.objects.count() == 1  # the refused bid left none
