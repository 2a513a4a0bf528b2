"""The OpenAPI schema and the Swagger page (marketplace/api/schema.py)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_openapi_schema_is_served():
    r = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] == "gpumarket API"
    for path in ("/api/v1/orders/", "/api/v1/auctions/", "/api/v1/auctions/{id}/bids/",
                 "/api/v1/runner/inventory/", "/api/v1/runner/leases/{id}/events/",
                 "/api/v1/wallet/dev-credit/"):
        assert path in doc["paths"], path
    assert "post" in doc["paths"]["/api/v1/orders/"]
    # the YAML form answers too
    assert APIClient().get("/api/schema/").status_code == 200


def test_swagger_page_is_served():
    r = APIClient().get("/api/docs/")
    assert r.status_code == 200
    page = r.content.decode()
    assert "swagger" in page.lower() and "/api/schema/" in page
