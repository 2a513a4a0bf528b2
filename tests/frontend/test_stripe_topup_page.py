"""Paying a wallet top-up in the page (frontend/stripe_views.py) against localstripe: the
script URL is a setting and never loaded without Stripe; the card is set up with Stripe,
the server charges the PaymentIntent and credits only what Stripe says succeeded, once;
another buyer's top-up or a card set up for another top-up is refused."""

from __future__ import annotations

import json

import pytest
import stripe
from django.urls import reverse

from settlement import services as ledger
from settlement.models import JournalEntry, TopUp
from tests.factories import UserFactory
from tests.settlement.test_stripe_topups import localstripe_url  # noqa: F401 (fixture)

PK = "pk_test_gpumarket"
pytestmark = pytest.mark.django_db


@pytest.fixture
def stripe_page(settings, localstripe_url):  # noqa: F811
    settings.STRIPE_SECRET_KEY = "sk_test_gpumarket"
    settings.STRIPE_PUBLISHABLE_KEY = PK
    settings.STRIPE_API_BASE = localstripe_url
    settings.STRIPE_JS_URL = f"{localstripe_url}/js.stripe.com/v3/"
    return localstripe_url


@pytest.fixture
def buyer(client):
    user = UserFactory()
    client.force_login(user)
    return user


def _start(client, amount="25.00"):
    r = client.post(reverse("wallet-topup"), {"amount": amount})
    assert r.status_code == 201, r.content.decode()[:2000]
    topup = TopUp.objects.latest("pk")
    return r.content.decode(), topup, r.context["payment"]


def _set_up_card(url: str, setup_secret: str, number: str = "4242424242424242") -> str:
    """What Stripe.js confirmCardSetup does with the Card Element's values."""
    sc = stripe.StripeClient("sk_test_gpumarket", base_addresses={"api": url})
    seti = setup_secret.split("_secret_")[0]
    done = sc.v1.setup_intents.confirm(seti, params={
        "payment_method_data": {"type": "card", "card": {
            "number": number, "exp_month": 12, "exp_year": 2034, "cvc": "123"}}})
    return done.id


def _pay(client, topup, setup_intent):
    return client.post(reverse("wallet-topup-pay", args=[topup.pk]),
                       json.dumps({"setup_intent": setup_intent}),
                       content_type="application/json")


def test_no_stripe_js_without_stripe(client, buyer, settings):
    settings.STRIPE_SECRET_KEY = ""
    settings.STRIPE_JS_URL = "http://127.0.0.1:9/js.stripe.com/v3/"
    html = client.get(reverse("wallet-page")).content.decode()
    assert "js.stripe.com" not in html and "stripe-topup.js" not in html
    assert client.post(reverse("wallet-topup-pay", args=[1]), "{}",
                       content_type="application/json").status_code == 404
    assert client.get(reverse("wallet-topup-return", args=[1])).status_code == 404


def test_page_loads_the_configured_stripe_js_and_the_card_form(client, buyer, stripe_page):
    html, topup, payment = _start(client)
    assert f'<script src="{stripe_page}/js.stripe.com/v3/"></script>' in html
    assert 'id="card-element"' in html and "Pay $25.00</button>" in html
    assert payment["payment_secret"].startswith(topup.payment_intent_id)
    assert payment["setup_secret"].startswith("seti_") and PK in html


def test_card_set_up_then_paid_is_credited_once_from_stripes_answer(client, buyer,
                                                                   stripe_page):
    _, topup, payment = _start(client)
    # the browser's word is not enough: before paying, the return path credits nothing
    r = client.get(reverse("wallet-topup-return", args=[topup.pk]), follow=True)
    assert "was not completed" in r.content.decode()
    assert ledger.wallet(user_id=buyer.pk).available == 0

    seti = _set_up_card(stripe_page, payment["setup_secret"])
    r = _pay(client, topup, seti)
    assert r.status_code == 200 and r.json() == {"status": "succeeded"}
    assert ledger.wallet(user_id=buyer.pk).available == 25_000_000
    # the page's return, a repeated pay: nothing more
    r = client.get(reverse("wallet-topup-return", args=[topup.pk]), follow=True)
    assert "Stripe confirmed your payment: $25.00 added." in r.content.decode()
    assert _pay(client, topup, seti).json() == {"status": "succeeded"}
    assert ledger.wallet(user_id=buyer.pk).available == 25_000_000
    assert JournalEntry.objects.filter(kind="stripe_topup").count() == 1
    topup.refresh_from_db()
    assert topup.status == "succeeded" and topup.credited == 25_000_000


def test_a_card_set_up_for_another_top_up_or_another_buyers_top_up_is_refused(
        client, buyer, stripe_page):
    _, first, first_payment = _start(client)
    _, second, _ = _start(client, "30.00")
    seti = _set_up_card(stripe_page, first_payment["setup_secret"])
    r = _pay(client, second, seti)
    assert r.status_code == 400 and "not set up for this top-up" in r.json()["error"]
    assert _pay(client, first, "not-a-setup-intent").status_code == 400
    client.force_login(UserFactory())
    assert _pay(client, first, seti).status_code == 404
    assert client.get(reverse("wallet-topup-return", args=[first.pk])).status_code == 404
    assert JournalEntry.objects.filter(kind="stripe_topup").count() == 0


def test_a_declined_card_never_reaches_the_payment(client, buyer, stripe_page):
    _, topup, payment = _start(client)
    with pytest.raises(stripe.CardError):
        _set_up_card(stripe_page, payment["setup_secret"], number="4000000000000002")
    seti = payment["setup_secret"].split("_secret_")[0]
    r = _pay(client, topup, seti)
    assert r.status_code == 400 and "not set up" in r.json()["error"]
    assert ledger.wallet(user_id=buyer.pk).available == 0
