"""What the OpenAPI schema says of the lists' `offset` and of nullable fields holds in the
answers (a schemathesis run against the running stack found both off)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core.pagination import MAX_OFFSET
from marketplace import auctions
from tests.factories import funded_buyer, registered_node
from tests.support.api import assert_refused, client_for

pytestmark = pytest.mark.django_db


def _schema() -> dict:
    return client_for().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()


def test_offset_up_to_the_schemas_maximum_is_taken_beyond_it_a_400_saying_the_range():
    [offset] = [p for p in _schema()["paths"]["/api/v1/orders/"]["get"]["parameters"]
                if p["name"] == "offset"]
    assert offset["schema"]["maximum"] == MAX_OFFSET
    user = client_for(funded_buyer(10))
    body = user.get("/api/v1/orders/", {"offset": str(MAX_OFFSET)}).json()
    assert body["results"] == [] and body["count"] == 0
    refused = user.get("/api/v1/orders/", {"offset": "184126317546130931712"})
    assert_refused(refused, "offset", contains=f"from 0 to {MAX_OFFSET}")


def test_an_open_auctions_clearing_price_is_null_as_the_schema_says():
    schema = _schema()["components"]["schemas"]["Auction"]["properties"]["clearing_price"]
    assert schema.get("nullable") is True
    provider, node, _ = registered_node()
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    assert client_for().get(f"/api/v1/auctions/{lot.pk}/").json()["clearing_price"] is None
