"""What a newcomer ran into (issue 2's trial): every answer under /api/ is JSON, strict
types, unknown fields named, Bearer tokens for programs, precise money messages."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from providers.models import Provider
from tests.factories import UserFactory, api_token, funded_buyer
from tests.support.api import client_for, snapshot

pytestmark = pytest.mark.django_db

BID = {"side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 1, "hours": 1, "price": "2.00"}


def test_post_without_trailing_slash_is_a_json_404_with_a_hint():
    r = client_for(funded_buyer(10)).post("/api/v1/orders", BID, format="json")
    assert r.status_code == 404
    assert r.json()["detail"] == "no API endpoint at /api/v1/orders: did you mean /api/v1/orders/ ?"
    for path in ("/api/v1/", "/api/v1/nope/", "/api/nope"):
        r = APIClient().get(path)
        assert r.status_code == 404 and r["Content-Type"] == "application/json", path


def test_deeply_nested_json_is_a_400():
    buyer = funded_buyer(10)
    before = snapshot(buyer)
    body = "[" * 200_000 + "]" * 200_000
    r = client_for(buyer).post("/api/v1/orders/", body, content_type="application/json")
    assert r.status_code == 400 and "nested deeper than 32 levels" in r.json()["detail"]
    assert snapshot(buyer) == before


def test_form_encoded_bodies_are_refused_as_unsupported():
    r = client_for(funded_buyer(10)).post("/api/v1/orders/", BID)  # multipart form
    assert r.status_code == 415


@pytest.mark.parametrize(("changes", "field"), [
    ({"image": 123}, "image"),
    ({"command": [1, 2]}, "command[0]"),
    ({"gpu_class": 7}, "gpu_class"),
    ({"gang_sise": 1}, "gang_sise"),
])
def test_strict_types_and_unknown_fields(changes, field):
    buyer = funded_buyer(10)
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", {**BID, **changes}, format="json")
    assert r.status_code == 400, r.json()
    assert field in r.json()["errors"], r.json()
    assert snapshot(buyer) == before


@pytest.mark.parametrize(("price", "says"), [
    ("-1", "must not be negative"), ("1e1", "not an exponent"), ("+1.5", "without a sign"),
    ("99999999999999999999999", "larger than the largest"), ("2.0000001", "6 decimal"),
])
def test_money_messages_say_what_is_wrong(price, says):
    r = client_for(funded_buyer(10)).post("/api/v1/orders/", {**BID, "price": price},
                                          format="json")
    assert r.status_code == 400 and says in r.json()["errors"]["price"][0]


def test_bearer_token_works_for_programs_too():
    user = UserFactory()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token(user)}")
    assert api.get("/api/v1/me/").json()["id"] == user.pk


def test_onboarding_again_answers_the_provider_and_never_renames():
    api = client_for(UserFactory())
    codes = [api.post("/api/v1/providers/", {"display_name": name}, format="json").status_code
             for name in ("NU Labs", "NU Labs", "NU Labs 2")]
    assert codes == [201, 200, 409]
    assert Provider.objects.get().display_name == "NU Labs"


def test_duration_in_seconds_is_echoed_and_hours_only_when_whole():
    buyer = funded_buyer(10)
    r = client_for(buyer).post("/api/v1/orders/", {**{k: v for k, v in BID.items()
                                                      if k != "hours"},
                                                   "duration_seconds": 8}, format="json")
    assert r.status_code == 201
    assert (r.json()["duration_seconds"], r.json()["hours"]) == (8, None)
