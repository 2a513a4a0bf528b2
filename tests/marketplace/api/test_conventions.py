"""What a new user's trial of the API found (issue: newcomer trial 2): JSON for every
answer under /api/ (no CSRF page, no HTML error page), duplicate JSON keys refused, the
other side's order fields refused, Docker image references checked, an OpenAPI schema
without warnings, one list shape with strict ?limit= and ?offset=, strict runner types,
one error rule, password validators, no zero chain address, prices in causes as USD,
node ids not revealed, heartbeats touching only their own node, idempotent onboarding."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import urls as root_urls
from marketplace.api import bid_batcher, errors
from marketplace.auctions import close_auction
from marketplace.models import Auction, Lease, Order
from providers.models import Gpu, Provider
from settlement.models import ChainAddress, Hold
from tests.factories import (
    RTX4090_DUMP,
    UserFactory,
    api_token,
    ask_body,
    funded_buyer,
    registered_node,
)
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db

BID = {"side": "bid", "gpu_class": "rtx-4090", "gpus": 1, "hours": 1, "price": "2.00"}


def _api_paths() -> list[str]:
    """Every API v1 URL of the URL map, with 1 for an id and a slug for a slug."""
    out = []
    for p in root_urls.api_v1:
        assert isinstance(p, URLPattern) and not isinstance(p, URLResolver)
        route = re.sub(r"<int:\w+>", "1", str(p.pattern))
        out.append("/api/v1/" + re.sub(r"<slug:\w+>", "rtx-4090", route))
    return out


def _is_json(r) -> bool:
    return r["Content-Type"].startswith("application/json") and isinstance(r.json(), dict)


# --- 1. JSON for every answer under /api/ ---------------------------------------------

@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "get"])
def test_missing_trailing_slash_is_a_json_404_with_csrf_checks_on(method):
    token = api_token(funded_buyer(10))
    for headers in ({"HTTP_AUTHORIZATION": f"Token {token}"}, {}):
        c = Client(enforce_csrf_checks=True)
        r = c.generic(method.upper(), "/api/v1/orders", json.dumps(BID),
                      content_type="application/json", **headers)
        assert r.status_code == 404, (method, headers, r.content[:200])
        assert _is_json(r)
        assert r.json() == {"detail": "no API endpoint at /api/v1/orders: did you mean "
                                      "/api/v1/orders/ ?"}


def test_session_post_without_trailing_slash_is_a_json_404_not_a_csrf_page():
    c = Client(enforce_csrf_checks=True)
    c.force_login(UserFactory())
    r = c.post("/api/v1/orders", json.dumps(BID), content_type="application/json")
    assert r.status_code == 404 and _is_json(r), r.content[:200]


def test_every_api_url_answers_json_to_anything_anonymous():
    """POST (with CSRF checks on) and PUT to every API URL, with and without the slash:
    whatever the status, the body is JSON."""
    for path in _api_paths():
        for url in (path, path.rstrip("/")):
            c = Client(enforce_csrf_checks=True)
            for method in ("POST", "PUT"):
                r = c.generic(method, url, "{}", content_type="application/json")
                assert r.status_code >= 400, (method, url)
                assert _is_json(r), (method, url, r.status_code, r.content[:200])


def test_djangos_own_errors_are_json_under_api_and_pages_elsewhere():
    # a Host header not in ALLOWED_HOSTS: Django answers 400 before any view
    r = Client().post("/api/v1/orders/", "{}", content_type="application/json",
                      HTTP_HOST="evil.example")
    assert r.status_code == 400 and _is_json(r) and r.json() == {"detail": "bad request"}
    r = Client().get("/", HTTP_HOST="evil.example")
    assert r.status_code == 400 and r["Content-Type"].startswith("text/html")
    # the handlers of the URL map
    assert (root_urls.handler400, root_urls.handler403, root_urls.handler404,
            root_urls.handler500) == (errors.bad_request, errors.permission_denied,
                                      errors.page_not_found, errors.server_error)
    rf = RequestFactory()
    for path, json_expected in (("/api/v1/orders/", True), ("/api", True), ("/wallet/", False),
                                ("/apiary/", False)):
        request = rf.get(path)
        answers = [errors.server_error(request),
                   errors.page_not_found(request, Exception("x")),
                   errors.permission_denied(request, Exception("x")),
                   errors.bad_request(request, Exception("x"))]
        assert [r.status_code for r in answers] == [500, 404, 403, 400]
        for r in answers:
            assert r["Content-Type"].startswith(
                "application/json" if json_expected else "text/html"), (path, r)


def test_stripe_webhook_wrong_method_is_json():
    r = APIClient().get("/api/v1/stripe/webhook/")
    assert r.status_code == 405 and _is_json(r) and r["Allow"] == "POST"


# --- 2. duplicate JSON keys ------------------------------------------------------------

def test_duplicate_json_key_is_refused_naming_it():
    buyer = funded_buyer(10)
    registered_node(RTX4090_DUMP)
    before = snapshot(buyer)
    body = ('{"side": "bid", "gpu_class": "rtx-4090", "gpus": 1, "hours": 1, '
            '"price": "0.01", "price": "5"}')
    r = client_for(buyer).post("/api/v1/orders/", body, content_type="application/json")
    body = assert_refused(r, "price", contains="more than once")
    assert body["detail"].startswith("price: ")
    assert snapshot(buyer) == before
    # the bid fast path hands it to the view (which answers the 400), never places it
    assert bid_batcher.parse_bid(b'{"side": "bid", "gpu_class": "rtx-4090", "gpus": 1, '
                                 b'"hours": 1, "price": "0.01", "price": "5"}') is None


def test_duplicate_key_inside_a_nested_object_is_refused():
    _, _, token = registered_node(RTX4090_DUMP)
    uuid = Gpu.objects.first().uuid
    body = '{"gpus": [{"uuid": "UUID", "temperature_c": 30, "temperature_c": 99}]}'.replace(
        "UUID", uuid)
    r = runner_client(token).post("/api/v1/runner/heartbeat/", body,
                                  content_type="application/json")
    assert_refused(r, "temperature_c", contains="more than once")
    assert Gpu.objects.get(uuid=uuid).last_health == {}


def test_a_body_that_is_not_json_has_no_field_to_name():
    r = client_for(funded_buyer(10)).post("/api/v1/orders/", '{"price": ',
                                          content_type="application/json")
    assert r.status_code == 400
    assert set(r.json()) == {"detail"} and r.json()["detail"].startswith("JSON parse error")


# --- 3. the other side's fields; image references ----------------------------------------

@pytest.mark.parametrize(("changes", "field"), [
    # (`node` is a bid's too: the one node it fills on, tests/marketplace/api/test_offers_api.py)
    ({"available_until": "2030-01-01T00:00:00Z"}, "available_until"),
])
def test_ask_fields_on_a_bid_are_refused(changes, field):
    buyer = funded_buyer(10)
    registered_node(RTX4090_DUMP)
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", {**BID, **changes}, format="json")
    assert_refused(r, field, contains="is for asks")
    assert snapshot(buyer) == before


@pytest.mark.parametrize(("changes", "field"), [
    ({"hours": 1}, "hours"),
    ({"duration_seconds": 60}, "duration_seconds"),
    ({"gang_size": 1}, "gang_size"),
    ({"time_in_force": "GTC"}, "time_in_force"),
    ({"time_in_force": "IOC"}, "time_in_force"),
    ({"image": "gpumarket/busybox:local"}, "image"),
    ({"command": ["sleep", "1"]}, "command"),
    ({"ports": [8888]}, "ports"),
    ({"expires_at": "2030-01-01T00:00:00Z"}, "expires_at"),
    ({"interruptible": False}, "interruptible"),
])
def test_bid_fields_on_an_ask_are_refused(changes, field):
    provider, node, _ = registered_node(RTX4090_DUMP)
    count = Order.objects.count()
    r = client_for(provider).post("/api/v1/orders/", ask_body(node, **changes), format="json")
    assert_refused(r, field, contains="is for bids")
    assert Order.objects.count() == count


@pytest.mark.parametrize("image", [
    "bad image name!!", "Ubuntu", "ubuntu:", "ubuntu:-x", "a___b", "-a", "a-", "team//app",
    "ubuntu@sha256:abc", "registry.example:port/app", "a:" + "x" * 129, "x" * 256, 5,
])
def test_bad_image_references_are_refused(image):
    buyer = funded_buyer(10)
    registered_node(RTX4090_DUMP)
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", {**BID, "image": image}, format="json")
    assert_refused(r, "image")
    assert snapshot(buyer) == before


@pytest.mark.parametrize("image", [
    "", "busybox", "gpumarket/busybox:local", "nvcr.io/nvidia/pytorch:24.05-py3",
    "registry.example:5000/team/app_1.x:v1", "a__b/c--d", "[2606:4700::1111]:5000/app",
    "8.8.8.8:5000/app", "localhost.example/app", "127/app",
    "pytorch/pytorch@sha256:" + "a" * 64, "ubuntu:22.04@sha256:" + "0" * 64,
])
def test_docker_image_references_are_accepted(image):
    registered_node(RTX4090_DUMP)
    r = client_for(funded_buyer(10)).post("/api/v1/orders/", {**BID, "image": image},
                                          format="json")
    assert r.status_code == 201, r.content


def test_sealed_bid_image_is_checked_too():
    provider, node, _ = registered_node(RTX4090_DUMP)
    r = client_for(provider).post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 1, "reserve_price": "1.00", "hours": 1,
        "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json")
    assert r.status_code == 201, r.content
    r = client_for(funded_buyer(10)).post(f"/api/v1/auctions/{r.json()['id']}/bids/",
                                          {"price": "1.20", "image": "Bad Image"},
                                          format="json")
    assert_refused(r, "image")


PRIVATE_IMAGES = ["127.0.0.1:22/x:1", "[::1]:5000/x:1", "10.0.0.5:5000/x:1", "localhost/x",
                  "localhost:5000/x:1", "169.254.169.254/x", "192.168.1.7:5000/a/b@sha256:"
                  + "0" * 64, "0.0.0.0:5000/x", "224.0.0.1/x", "[fe80::1]:5000/x",
                  "[::ffff:7f00:1]:5000/x", "127.1:5000/x", "0x7f.1/x", "dev.localhost/x"]


@pytest.mark.parametrize("image", PRIVATE_IMAGES)
def test_an_image_from_a_private_or_loopback_registry_is_refused(image):
    buyer = funded_buyer(10)
    registered_node(RTX4090_DUMP)
    before = snapshot(buyer)
    r = client_for(buyer).post("/api/v1/orders/", {**BID, "image": image}, format="json")
    assert_refused(r, "image", contains="must not name a registry at a private or loopback")
    assert snapshot(buyer) == before


def test_a_private_registry_is_allowed_by_the_setting_and_sealed_bids_refuse_it(settings):
    provider, node, _ = registered_node(RTX4090_DUMP)
    r = client_for(provider).post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 1, "reserve_price": "1.00", "hours": 1,
        "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json")
    assert r.status_code == 201, r.content
    sealed = f"/api/v1/auctions/{r.json()['id']}/bids/"
    buyer = client_for(funded_buyer(10))
    refused = buyer.post(sealed, {"price": "1.20", "image": "127.0.0.1:5000/x:1"},
                         format="json")
    assert_refused(refused, "image", contains="registry 127.0.0.1 is a loopback address")
    settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY = True
    r = buyer.post(sealed, {"price": "1.20", "image": "127.0.0.1:5000/x:1"}, format="json")
    assert r.status_code == 201, r.content
    r = buyer.post("/api/v1/orders/", {**BID, "image": "[::1]:5000/x:1"}, format="json")
    assert r.status_code == 201, r.content


# --- 4. the OpenAPI schema -------------------------------------------------------------

def test_schema_generation_has_no_warnings_and_validates(tmp_path):
    from drf_spectacular.drainage import GENERATOR_STATS

    GENERATOR_STATS.reset()  # warnings of schemas generated earlier in this process
    out = tmp_path / "schema.yml"
    # raises when the generator logs any warning or error, or the schema is invalid
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    assert out.stat().st_size > 0


def _schema() -> dict:
    r = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    return r.json()


def test_every_operation_documents_its_answer_body_and_takes_json_only():
    doc = _schema()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            ok = {code: resp for code, resp in op["responses"].items() if code.startswith("2")}
            assert ok, (method, path)
            for code, resp in ok.items():
                if code == "204":  # No Content: a body is what HTTP forbids there
                    assert not resp.get("content"), (method, path)
                    continue
                assert "application/json" in resp.get("content", {}), \
                    f"{method} {path} {code}: no response body documented"
            if "requestBody" in op:
                assert list(op["requestBody"]["content"]) == ["application/json"], (method, path)
    signup = doc["paths"]["/api/v1/signup/"]["post"]["responses"]
    assert list(signup) == ["201"]
    ref = signup["201"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    assert set(doc["components"]["schemas"][ref]["properties"]) == {"id", "username", "token",
                                                                    "expires_at",
                                                                    "token_expires_at"}
    token = doc["paths"]["/api/v1/auth/token/"]["post"]["requestBody"]["content"]
    assert list(token) == ["application/json"]


# --- 5. one list shape, strict ?limit= and ?offset= ---------------------------------------

LISTS = ["/api/v1/gpu-classes/", "/api/v1/fills/", "/api/v1/orders/", "/api/v1/auctions/",
         "/api/v1/sealed-bids/", "/api/v1/leases/", "/api/v1/nodes/", "/api/v1/payouts/",
         "/api/v1/ledger/entries/", "/api/v1/auth/tokens/", "/api/v1/wallet/history/",
         "/api/v1/webhooks/", "/api/v1/alert-rules/"]
# lists under one of your objects: their pages are tested with their package
# (tests/webhooks/test_api.py)
LISTS_UNDER_AN_ID = ["/api/v1/webhooks/{id}/deliveries/"]


def test_every_list_in_the_schema_is_paginated_and_tested_here():
    doc = _schema()
    listed = []
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        schema = ops["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema.get("type") != "array", f"GET {path} answers a bare list"
        name = schema.get("$ref", "").split("/")[-1]
        if name.startswith("Paginated"):
            listed.append(path)
            params = {p["name"] for p in ops["get"].get("parameters", [])}
            assert {"limit", "offset"} <= params, path
    assert sorted(listed) == sorted(LISTS + LISTS_UNDER_AN_ID)


@pytest.mark.parametrize("url", LISTS)
def test_every_list_answers_count_next_previous_results(url):
    user = funded_buyer(10)
    body = client_for(user).get(url).json()
    assert set(body) == {"count", "next", "previous", "results"}, (url, body)
    body = client_for(user).get(url, {"limit": "500", "offset": "0"}).json()
    assert set(body) == {"count", "next", "previous", "results"}, (url, body)


@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize(("params", "field"), [
    ({"limit": "-1"}, "limit"), ({"limit": "abc"}, "limit"), ({"limit": "0"}, "limit"),
    ({"limit": "501"}, "limit"), ({"limit": ""}, "limit"), ({"limit": "1.5"}, "limit"),
    ({"limit": " 5"}, "limit"), ({"offset": "-5"}, "offset"), ({"offset": "x"}, "offset"),
    ({"offset": "1e3"}, "offset"),
])
def test_bad_limit_or_offset_is_a_400_naming_it(url, params, field):
    r = client_for(funded_buyer(10)).get(url, params)
    body = assert_refused(r, field)
    assert set(body["errors"]) == {field}


def test_payouts_page_through_limit_and_offset():
    from settlement.models import Payout

    provider = UserFactory()
    for i in range(3):
        Payout.objects.create(provider=provider, amount=10_000 * (i + 1),
                              amount_cents=i + 1)
    body = client_for(provider).get("/api/v1/payouts/", {"limit": 2}).json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]
    body = client_for(provider).get("/api/v1/payouts/", {"limit": 2, "offset": 2}).json()
    assert [p["amount_cents"] for p in body["results"]] == [1] and body["previous"]


# --- 6. strict runner types; money type messages ----------------------------------------

def _pending_lease():
    provider, node, token = registered_node(RTX4090_DUMP)
    client_for(provider).post("/api/v1/orders/", ask_body(node, gpus=1), format="json")
    r = client_for(funded_buyer(10)).post("/api/v1/orders/", {**BID, "price": "2.00"},
                                          format="json")
    (lease_id,) = r.json()["leases"]
    return token, lease_id


@pytest.mark.parametrize(("changes", "field"), [
    ({"usage_seconds": "10"}, "usage_seconds"),
    ({"usage_seconds": 10.0}, "usage_seconds"),
    ({"usage_seconds": True}, "usage_seconds"),
    ({"cause": 7}, "cause"),
    ({"container_id": 123}, "container_id"),
])
def test_runner_lease_event_types_are_strict(changes, field):
    token, lease_id = _pending_lease()
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease_id}/events/",
                                  {"status": "failed", **changes}, format="json")
    assert_refused(r, field)
    assert Lease.objects.get(pk=lease_id).status == "pending"


@pytest.mark.parametrize(("reading", "field"), [
    ({"temperature_c": "45"}, "gpus[0].temperature_c"),
    ({"utilization_pct": 1.5}, "gpus[0].utilization_pct"),
    ({"ecc_uncorrectable": False}, "gpus[0].ecc_uncorrectable"),
    ({"power_w": "71.5"}, "gpus[0].power_w"),
    ({"power_w": True}, "gpus[0].power_w"),
])
def test_runner_heartbeat_types_are_strict(reading, field):
    _, _, token = registered_node(RTX4090_DUMP)
    uuid = Gpu.objects.first().uuid
    r = runner_client(token).post("/api/v1/runner/heartbeat/",
                                  {"gpus": [{"uuid": uuid, **reading}]}, format="json")
    assert_refused(r, field)


def test_runner_inventory_types_are_strict():
    from providers import services

    provider = services.provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    created = services.node_create(provider=provider, name="n")
    gpu = {"uuid": "GPU-12345678-1234-1234-1234-123456789abc", "product_name": "x",
           "gpu_class": "rtx-4090", "memory_mib": "24564", "pci_bus_id": "00:01.0"}
    r = runner_client(created.runner_token).post("/api/v1/runner/inventory/", {
        "driver_version": "535", "gpus": [gpu]}, format="json")
    assert_refused(r, "gpus[0].memory_mib")
    assert Gpu.objects.count() == 0


@pytest.mark.parametrize(("amount", "says"), [
    (True, 'must be a decimal string in USD such as "2.49", not true'),
    (False, "not false"), (5, "not a number"), (["1"], "not an array"),
    ({"usd": "1"}, "not an object"),
])
def test_amount_of_the_wrong_json_type_says_it_must_be_a_decimal_string(settings, amount,
                                                                         says):
    settings.GPUMARKET_DEV_CREDIT = True
    r = client_for(UserFactory()).post("/api/v1/wallet/dev-credit/", {"amount": amount},
                                       format="json")
    body = assert_refused(r, "amount", contains=says)
    assert "must be a decimal string" in body["errors"]["amount"][0]


# --- 7. one error rule: `errors` exactly when fields are at fault --------------------------

def test_token_login_failure_names_no_field_and_takes_json_only():
    UserFactory(username="dora")
    r = APIClient().post("/api/v1/auth/token/", {"username": "dora", "password": "wrong"},
                         format="json")
    assert r.status_code == 400
    assert r.json() == {"detail": "unable to log in with these credentials"}
    r = APIClient().post("/api/v1/auth/token/", {"username": "dora",
                                                 "password": "correct-horse-battery"})
    assert r.status_code == 415 and set(r.json()) == {"detail"}  # a form: JSON only
    r = APIClient().post("/api/v1/auth/token/", {"username": "dora",
                                                 "password": "correct-horse-battery"},
                         format="json")
    assert r.status_code == 200 and r.json()["token"]
    assert_refused(APIClient().post("/api/v1/auth/token/", {"username": "dora"},
                                    format="json"), "password")


def test_errors_without_a_field_have_detail_only():
    buyer = funded_buyer(10)
    registered_node(RTX4090_DUMP)
    api = client_for(buyer)
    order = api.post("/api/v1/orders/", {**BID, "price": "0.50"}, format="json").json()
    assert api.post(f"/api/v1/orders/{order['id']}/cancel/").status_code == 200
    answers = {
        "409": api.post(f"/api/v1/orders/{order['id']}/cancel/"),
        "401": APIClient().get("/api/v1/orders/"),
        "415": api.post("/api/v1/orders/", BID),
        "parse": api.post("/api/v1/orders/", "{", content_type="application/json"),
        "list body": api.post("/api/v1/orders/", [1], format="json"),
    }
    for what, r in answers.items():
        assert 400 <= r.status_code < 500, what
        assert set(r.json()) == {"detail"}, (what, r.json())
        assert r.json()["detail"], what
    assert answers["409"].status_code == 409


# --- 8. passwords ------------------------------------------------------------------------

@pytest.mark.parametrize(("username", "password", "says"), [
    ("erin", "password", "too common"),
    ("erin", "12345678", "entirely numeric"),
    ("erin", "short-pw", "too short"),
    ("frankenstein", "frankenstein1", "too similar to the username"),
])
def test_signup_refuses_weak_passwords_with_djangos_messages(username, password, says):
    from django.contrib.auth import get_user_model

    r = APIClient().post("/api/v1/signup/", {"username": username, "password": password},
                         format="json")
    body = assert_refused(r, "password")
    assert any(says in m for m in body["errors"]["password"]), body
    assert not get_user_model().objects.filter(username=username).exists()


@pytest.mark.parametrize("username", ["x", "has space"])
def test_signup_says_the_username_rule(username):
    r = APIClient().post("/api/v1/signup/", {"username": username,
                                             "password": "a long password"}, format="json")
    body = assert_refused(r, "username")
    assert "3 to 150 characters" in body["errors"]["username"][0], body


def test_signup_with_a_good_password_answers_201_with_the_token():
    r = APIClient().post("/api/v1/signup/", {"username": "grace",
                                             "password": "a long password"}, format="json")
    assert r.status_code == 201 and set(r.json()) == {"id", "username", "token",
                                                                    "expires_at",
                                                                    "token_expires_at"}


def test_signup_page_shows_the_validators_messages():
    from django.contrib.auth import get_user_model

    r = Client().post("/signup/", {"username": "heidi", "password1": "password",
                                   "password2": "password"})
    assert r.status_code == 400
    assert "This password is too common." in r.content.decode()
    assert not get_user_model().objects.filter(username="heidi").exists()


# --- 9. chain address, prices in causes, node ids, heartbeats of other nodes --------------

@pytest.mark.parametrize("address", ["0x" + "0" * 40, "0X" + "0" * 40])
def test_the_zero_chain_address_is_refused(address):
    r = client_for(UserFactory()).post("/api/v1/chain/address/", {"address": address},
                                       format="json")
    assert_refused(r, "address", contains="zero address")
    assert ChainAddress.objects.count() == 0


def test_auction_causes_show_prices_in_usd_per_gpu_hour():
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer = funded_buyer(100)
    r = client_for(provider).post("/api/v1/auctions/", {
        "node": node.pk, "gpus": 1, "reserve_price": "0.35", "hours": 1,
        "rule": "second_price",
        "closes_at": (timezone.now() + timedelta(minutes=5)).isoformat()}, format="json")
    auction_id = r.json()["id"]
    r = client_for(buyer).post(f"/api/v1/auctions/{auction_id}/bids/",
                               {"price": "0.50", "gpus": 1}, format="json")
    assert r.status_code == 201, r.content
    auction = Auction.objects.get(pk=auction_id)
    assert close_auction(auction_id=auction_id, now=auction.closes_at) is not None
    lease = client_for(buyer).get("/api/v1/leases/").json()["results"][0]
    cause = lease["events"][0]["cause"]
    assert cause == f"won auction {auction_id} (second_price) at 0.350000 USD/GPU-hour"
    assert "350000 " not in cause.replace("0.350000", "")
    hold_events = client_for(buyer).get("/api/v1/ledger/entries/").json()["results"]
    assert hold_events  # the hold's entries exist; their memos carry no raw micro-USD
    for entry in hold_events:
        assert not re.search(r"\bat \d{4,}\b", entry["memo"]), entry["memo"]
    awards = auction.events.get(to_status="closed").detail["awards"]
    assert awards == [f"bid {r.json()['id']}: 1 GPUs at 0.350000 USD/GPU-hour"]
    assert Hold.objects.filter(buyer=buyer).exists()


def test_someone_elses_node_and_a_missing_node_get_the_same_404():
    _, node, _ = registered_node(RTX4090_DUMP)
    stranger = UserFactory()
    Provider.objects.create(user=stranger, display_name="Other")
    api = client_for(stranger)
    closes = (timezone.now() + timedelta(minutes=5)).isoformat()
    for node_id in (node.pk, node.pk + 1000):
        for url, body in (("/api/v1/orders/", ask_body(node, node=node_id)),
                          ("/api/v1/auctions/", {"node": node_id, "gpus": 1,
                                                 "reserve_price": "1.00", "hours": 1,
                                                 "closes_at": closes})):
            r = api.post(url, body, format="json")
            assert r.status_code == 404, (url, r.content)
            assert r.json() == {"detail": f"node: no node {node_id} of yours",
                                "errors": {"node": [f"no node {node_id} of yours"]}}


def test_heartbeat_naming_another_nodes_gpu_changes_nothing_there():
    _, node_a, _ = registered_node(RTX4090_DUMP, name="a")
    _, node_b, token_b = registered_node(name="b")  # the H100 host
    victim = Gpu.objects.filter(node=node_a).first()
    own = Gpu.objects.filter(node=node_b).first()
    r = runner_client(token_b).post("/api/v1/runner/heartbeat/", {
        "gpus": [{"uuid": victim.uuid, "temperature_c": 99}, {"uuid": own.uuid}],
        "findings": [{"uuid": own.uuid, "rule": "temperature", "severity": "warn",
                      "evidence": "warm"},
                     {"uuid": victim.uuid, "rule": "xid", "severity": "fatal",
                      "evidence": "XID 79"}],
    }, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["warnings"] == [
        f"gpus[0].uuid: {victim.uuid} is not a GPU of this node; ignored",
        f"findings[1].uuid: {victim.uuid} is not a GPU of this node; ignored"]
    victim.refresh_from_db()
    assert victim.healthy and victim.findings == [] and victim.last_health == {}
    own.refresh_from_db()
    assert [f["rule"] for f in own.findings] == ["temperature"] and own.healthy
    # a heartbeat of its own GPUs only has no warnings
    r = runner_client(token_b).post("/api/v1/runner/heartbeat/", {"gpus": [{"uuid": own.uuid}]},
                                    format="json")
    assert "warnings" not in r.json()


# --- 10. onboarding twice ------------------------------------------------------------------

def test_onboarding_again_is_idempotent_and_never_renames():
    api = client_for(UserFactory())
    r = api.post("/api/v1/providers/", {"display_name": "NU Labs"}, format="json")
    assert r.status_code == 201
    first = r.json()
    r = api.post("/api/v1/providers/", {"display_name": "NU Labs"}, format="json")
    assert r.status_code == 200 and r.json() == first
    r = api.post("/api/v1/providers/", {"display_name": "NU Labs 2"}, format="json")
    assert_refused(r, "display_name", status=409, contains="already")
    assert Provider.objects.get().display_name == "NU Labs"
    assert_refused(api.post("/api/v1/providers/", {"display_name": "x", "name": "y"},
                            format="json"), "name")
