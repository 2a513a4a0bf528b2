"""Issue 10, items 6 and 9: the page forms refuse a NUL in every field with a 400 naming it
and write nothing (the bid form's command was a 500), and they validate through the API's
own field definitions: every value the API refuses for a field, the page refuses with the
same message (an order was stored from the page with the image `NOT A VALID IMAGE<script>`
that the API refuses)."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.urls import reverse

from marketplace.models import Order
from tests.frontend.test_pages_buyer import login
from tests.marketplace.api.test_nul_input import _endpoints, _put, _state, world  # noqa: F401
from tests.support.api import client_for

pytestmark = pytest.mark.django_db
NUL = "a\x00b"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHv8cHjDBpO1c4CXN1sFwVd3QxUJvdBqUZXmGMcAxlfs me"
H100 = "h100-sxm-80gb"


def _pages(w):
    """(name, who, url, valid form data, its fields)."""
    bid = {"gpus": "1", "hours": "1", "price": "1.00", "gang_size": "", "time_in_force": "GTC",
           "image": "gpumarket/busybox:local", "command": "echo hi", "ports": "8888"}
    return [
        ("signup", None, reverse("signup-page"),
         {"username": "pat", "password1": "a long passphrase 9",
          "password2": "a long passphrase 9"}, ["username", "password1", "password2"]),
        ("login", None, reverse("login"),
         {"username": w.buyer.username, "password": "correct-horse-battery"},
         ["username", "password"]),
        ("bid", "buyer", reverse("market", args=[H100]), bid, list(bid)),
        ("sealed bid", "buyer", reverse("auction", args=[w.lot.pk]),
         {"price": "1.50", "gpus": "", "min_gpus": "", "image": "gpumarket/busybox:local",
          "command": "sleep 1", "ports": ""},
         ["price", "gpus", "min_gpus", "image", "command", "ports"]),
        ("dev credit", "buyer", reverse("wallet-dev-credit"), {"amount": "5.00"}, ["amount"]),
        ("provider", "newcomer", reverse("portal-onboard"), {"display_name": "Acme 2"},
         ["display_name"]),
        ("node", "provider", reverse("node-add"), {"name": "node-9"}, ["name"]),
        ("ask", "provider", reverse("ask-add"),
         {"node": str(w.node.pk), "gpus": "1", "price": "3.00", "available_hours": "24"},
         ["node", "gpus", "price", "available_hours"]),
        ("auction", "provider", reverse("auction-add"),
         {"node": str(w.lot_node.pk), "gpus": "1", "reserve_price": "1.00", "hours": "1",
          "rule": "second_price", "closes_in_minutes": "10"},
         ["node", "gpus", "reserve_price", "hours", "rule", "closes_in_minutes"]),
        ("chain address", "provider", reverse("payout-address"),
         {"address": "0x" + "1" * 40}, ["address"]),
        ("ssh key", "buyer", reverse("ssh-key-add-page"),
         {"name": "laptop", "public_key": SSH_KEY}, ["name", "public_key"]),
    ]


def _page_client(client, w, who):
    if who is not None:
        login(client, {"buyer": w.buyer, "provider": w.provider, "newcomer": w.newcomer}[who])
    return client


def form_errors(html: str, field: str) -> list[str]:
    """The messages rendered under the form field `field`."""
    m = re.search(rf'id="id_{field}_error"[^>]*>(.*?)</ul>', html, re.S)
    if m is None:
        return []
    return [unescape(re.sub(r"<[^>]+>", "", li)).strip()
            for li in re.findall(r"<li>(.*?)</li>", m.group(1), re.S)]


PAGE_NAMES = ["signup", "login", "bid", "sealed bid", "dev credit", "provider", "node", "ask",
              "auction", "chain address", "ssh key"]


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_a_nul_in_any_field_of_any_page_form_is_a_400_naming_it(world, client, settings,  # noqa: F811
                                                                name):
    settings.GPUMARKET_DEV_CREDIT = True
    [(_, who, url, data, fields)] = [p for p in _pages(world) if p[0] == name]
    client = _page_client(client, world, who)
    for field in fields:
        before = _state(world)
        r = client.post(url, {**data, field: NUL})
        assert r.status_code == 400, (name, field, r.status_code)
        assert form_errors(r.content.decode(), field), (name, field)
        assert _state(world) == before, (name, field)


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_the_valid_page_forms_above_are_accepted(world, client, settings, name):  # noqa: F811
    settings.GPUMARKET_DEV_CREDIT = True
    [(_, who, url, data, _)] = [p for p in _pages(world) if p[0] == name]
    r = _page_client(client, world, who).post(url, data)
    assert r.status_code in (201, 302), (name, r.status_code)


# (page, API endpoint, form field, API field, the API's JSON value, the page's text)
TEXT = "NOT A VALID IMAGE<script>alert(1)</script>"
SAME = [
    ("bid", "bid", "image", "image", TEXT, TEXT),
    ("bid", "bid", "image", "image", "Upper/Case:1", "Upper/Case:1"),
    ("bid", "bid", "image", "image", "a" * 256, "a" * 256),
    ("bid", "bid", "image", "image", "x:", "x:"),
    ("bid", "bid", "command", "command", ["a" * 1001], "a" * 1001),
    ("bid", "bid", "command", "command", ["w"] * 65, " ".join(["w"] * 65)),
    ("bid", "bid", "command", "command", ["a", "", "b"], 'a "" b'),
    ("bid", "bid", "ports", "ports", [0], "0"),
    ("bid", "bid", "ports", "ports", [70000], "70000"),
    ("bid", "bid", "ports", "ports", list(range(1, 10)), "1 2 3 4 5 6 7 8 9"),
    ("bid", "bid", "ports", "ports", ["x"], "x"),
    ("bid", "bid", "ports", "ports", [80, 80], "80, 80"),
    ("bid", "bid", "price", "price", "0", "0"),
    ("bid", "bid", "price", "price", "-1.50", "-1.50"),
    ("bid", "bid", "price", "price", "2.4900001", "2.4900001"),
    ("bid", "bid", "price", "price", "1e3", "1e3"),
    ("bid", "bid", "price", "price", " 2.49", " 2.49"),
    ("bid", "bid", "price", "price", "NaN", "NaN"),
    ("bid", "bid", "price", "price", "99999999999999", "99999999999999"),
    ("bid", "bid", "gpus", "gpus", 0, "0"),
    ("bid", "bid", "gpus", "gpus", -1, "-1"),
    ("bid", "bid", "gpus", "gpus", 10**9, "1000000000"),
    ("bid", "bid", "gpus", "gpus", 2.5, "2.5"),
    ("bid", "bid", "gpus", "gpus", "two", "two"),
    ("bid", "bid", "hours", "hours", 0, "0"),
    ("bid", "bid", "hours", "hours", 10**6, "1000000"),
    ("bid", "bid", "gang_size", "gang_size", 0, "0"),
    ("bid", "bid", "gang_size", "gang_size", 2, "2"),  # does not divide gpus (1)
    ("bid", "bid", "time_in_force", "time_in_force", "XX", "XX"),
    ("sealed bid", "sealed bid", "price", "price", "0", "0"),
    ("sealed bid", "sealed bid", "gpus", "gpus", 0, "0"),
    ("sealed bid", "sealed bid", "min_gpus", "min_gpus", 5000, "5000"),
    ("sealed bid", "sealed bid", "image", "image", TEXT, TEXT),
    ("sealed bid", "sealed bid", "command", "command", ["a" * 1001], "a" * 1001),
    ("sealed bid", "sealed bid", "ports", "ports", [0], "0"),
    ("provider", "provider", "display_name", "display_name", "x" * 101, "x" * 101),
    ("provider", "provider", "display_name", "display_name", "   ", "   "),
    ("node", "node", "name", "name", "x" * 101, "x" * 101),
    ("ask", "ask", "gpus", "gpus", 0, "0"),
    ("ask", "ask", "price", "price", "1e3", "1e3"),
    ("auction", "auction", "gpus", "gpus", 0, "0"),
    ("auction", "auction", "reserve_price", "reserve_price", "-1", "-1"),
    ("auction", "auction", "hours", "hours", 0, "0"),
    ("auction", "auction", "rule", "rule", "nope", "nope"),
    ("chain address", "chain address", "address", "address", "0x" + "0" * 40, "0x" + "0" * 40),
    ("chain address", "chain address", "address", "address", "0x123", "0x123"),
    ("chain address", "chain address", "address", "address", "x" * 43, "x" * 43),
    ("dev credit", "dev credit", "amount", "amount", "1000001", "1000001"),
    ("dev credit", "dev credit", "amount", "amount", "0", "0"),
    ("signup", "signup", "username", "username", "ab", "ab"),
    ("signup", "signup", "username", "username", "bad name!", "bad name!"),
]


def _api_messages(errors: dict, field: str) -> list[str]:
    """The API's messages for `field`: its own, and its items' as `field[i]: message`."""
    return [m if key == field else f"{key}: {m}" for key, messages in errors.items()
            if key == field or key.startswith(field + "[") for m in messages]


@pytest.mark.parametrize(("page", "endpoint", "form_field", "api_field", "value", "text"), SAME,
                         ids=[f"{c[0]}.{c[2]}={str(c[5])[:20]!r}" for c in SAME])
def test_what_the_api_refuses_the_page_refuses_with_the_same_message(
        world, client, settings, page, endpoint, form_field, api_field, value, text):  # noqa: F811
    settings.GPUMARKET_DEV_CREDIT = True
    [(_, who, url, body, _)] = [e for e in _endpoints(world) if e[0] == endpoint]
    api = client_for({"buyer": world.buyer, "provider": world.provider,
                      "newcomer": world.newcomer}.get(who))
    r = api.post(url, json.dumps(_put(body, api_field, value)), content_type="application/json")
    assert 400 <= r.status_code < 500, (r.status_code, r.content)
    said = _api_messages(r.json().get("errors", {}), api_field)
    assert said, r.json()

    [(_, who, url, data, _)] = [p for p in _pages(world) if p[0] == page]
    before = _state(world)
    r = _page_client(client, world, who).post(url, {**data, form_field: text})
    assert r.status_code == 400
    assert form_errors(r.content.decode(), form_field) == said
    assert _state(world) == before


def test_the_attacks_image_is_not_stored_from_the_page(world, client):  # noqa: F811
    login(client, world.buyer)
    r = client.post(reverse("market", args=[H100]), {
        "gpus": "1", "hours": "1", "price": "1.00", "time_in_force": "GTC",
        "image": TEXT, "command": "", "ports": ""})
    assert r.status_code == 400
    assert not Order.objects.filter(image__contains="<script>").exists()
