"""Stripe top-ups against localstripe (PyPI) on 127.0.0.1, with the official `stripe`
library pointed at it, and real signed webhook payloads: localstripe itself signs and
delivers `payment_intent.succeeded` to our endpoint on the live server; replays,
forgeries and stale deliveries are built with Stripe's signature scheme
(t=<unix time>,v1=HMAC-SHA256(secret, "<t>.<raw body>")). Stripe's cloud is the only
thing not here."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time

import httpx
import pytest
import stripe
from rest_framework.test import APIClient

from settlement import services as ledger
from settlement.checks import LEDGER_CHECKS, first_violation
from settlement.models import JournalEntry, StripeEvent, TopUp
from settlement.stripe_payments import cents_to_micros, micros_to_whole_cents
from tests.conftest import require_or_skip
from tests.factories import UserFactory, api_token
from tests.support.net import free_port
from tests.support.waiting import wait_until

WEBHOOK_SECRET = "whsec_gpumarket_test_secret"
pytestmark = pytest.mark.ledger("ledger_only")


@pytest.fixture(scope="session")
def localstripe_url():
    try:
        import localstripe  # noqa: F401
    except ImportError:
        require_or_skip("localstripe is not installed (pip install -e '.[test]')")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localstripe", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{url}/js.stripe.com/v3/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until("localstripe to answer", up, timeout=30)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def stripe_on(settings, localstripe_url):
    settings.STRIPE_SECRET_KEY = "sk_test_gpumarket"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_API_BASE = localstripe_url
    return localstripe_url


def _client(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return api


def _signed(payload: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    at = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), b"%d.%s" % (at, payload), hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def _pay(localstripe_url: str, payment_intent: str) -> stripe.PaymentIntent:
    """What Stripe.js does in the buyer's browser: attach a test card, then confirm
    (localstripe implements confirm without a payment_method argument only)."""
    sc = stripe.StripeClient("sk_test_gpumarket", base_addresses={"api": localstripe_url})
    sc.v1.payment_intents.update(payment_intent, params={"payment_method": "pm_card_visa"})
    return sc.v1.payment_intents.confirm(payment_intent)


def _event(intent: dict, event_id: str = "evt_gpumarket_1") -> bytes:
    return json.dumps({"id": event_id, "object": "event", "type": "payment_intent.succeeded",
                       "created": int(time.time()), "api_version": "2020-08-27",
                       "data": {"object": intent}}).encode()


def test_unit_conversions():
    assert cents_to_micros(2500) == 25_000_000
    assert micros_to_whole_cents(25_009_999) == (2500, 9_999)


@pytest.mark.django_db(transaction=True)
def test_topup_credited_by_localstripe_webhook_once(stripe_on, live_server):
    sc = stripe.StripeClient("sk_test_gpumarket", base_addresses={"api": stripe_on})
    httpx.post(f"{stripe_on}/_config/webhooks/gpumarket",
               data={"url": f"{live_server.url}/api/v1/stripe/webhook/",
                     "secret": WEBHOOK_SECRET}).raise_for_status()
    buyer = UserFactory()
    api = _client(buyer)
    r = api.post("/api/v1/wallet/topups/", {"amount": "25.00"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["client_secret"].startswith(r.json()["payment_intent"])
    assert ledger.wallet(user_id=buyer.pk).available == 0  # not before the webhook

    _pay(stripe_on, r.json()["payment_intent"])
    wait_until("the webhook to credit the wallet",
               lambda: ledger.wallet(user_id=buyer.pk).available == 25_000_000, timeout=20)
    assert TopUp.objects.get().status == "succeeded"

    # a duplicated delivery (same event id) and a new event for the same PaymentIntent
    intent = sc.v1.payment_intents.retrieve(r.json()["payment_intent"]).to_dict()
    event_id = StripeEvent.objects.get(type="payment_intent.succeeded").event_id
    for eid in (event_id, "evt_other_delivery"):
        body = _event(intent, eid)
        resp = api.post("/api/v1/stripe/webhook/", body, content_type="application/json",
                        HTTP_STRIPE_SIGNATURE=_signed(body))
        assert resp.status_code == 200
    assert ledger.wallet(user_id=buyer.pk).available == 25_000_000
    assert JournalEntry.objects.filter(kind="stripe_topup").count() == 1
    assert first_violation(LEDGER_CHECKS) is None


@pytest.mark.django_db
def test_forged_stale_unsigned_and_malformed_webhooks_change_nothing(stripe_on):
    buyer = UserFactory()
    intent = {"id": "pi_forged", "object": "payment_intent", "amount_received": 10_000_00,
              "metadata": {"gpumarket_user_id": str(buyer.pk)}}
    body = _event(intent, "evt_forged")
    api = APIClient()
    cases = {
        "wrong secret": _signed(body, secret="whsec_attacker"),
        "stale": _signed(body, at=int(time.time()) - 3600),
        "unsigned": None,
        "garbage header": "v1=deadbeef",
    }
    for why, header in cases.items():
        extra = {"HTTP_STRIPE_SIGNATURE": header} if header else {}
        resp = api.post("/api/v1/stripe/webhook/", body, content_type="application/json",
                        **extra)
        assert resp.status_code == 400, why
        assert resp.json()["detail"], why
    bad_json = b"{not json"
    resp = api.post("/api/v1/stripe/webhook/", bad_json, content_type="application/json",
                    HTTP_STRIPE_SIGNATURE=_signed(bad_json))
    assert resp.status_code == 400
    assert ledger.wallet(user_id=buyer.pk).available == 0
    assert StripeEvent.objects.count() == 0 and JournalEntry.objects.count() == 0


@pytest.mark.django_db
def test_topup_input_is_checked(stripe_on, settings):
    api = _client(UserFactory())
    for bad in ("0.50", "25.001", 25, "-5", "2000000.00"):
        r = api.post("/api/v1/wallet/topups/", {"amount": bad}, format="json")
        assert r.status_code == 400, bad
        assert "amount" in r.json()["detail"], bad
    assert TopUp.objects.count() == 0
    settings.STRIPE_SECRET_KEY = ""
    r = api.post("/api/v1/wallet/topups/", {"amount": "25.00"}, format="json")
    assert r.status_code == 404


def _charge_event(event_type: str, obj: dict, event_id: str) -> bytes:
    return json.dumps({"id": event_id, "object": "event", "type": event_type,
                       "created": int(time.time()), "data": {"object": obj}}).encode()


def _deliver(body: bytes):
    return APIClient().post("/api/v1/stripe/webhook/", body, content_type="application/json",
                            HTTP_STRIPE_SIGNATURE=_signed(body))


@pytest.mark.django_db
def test_refunds_and_disputes_debit_the_wallet_once_and_never_below_zero(stripe_on):
    buyer = UserFactory()
    TopUp.objects.create(buyer=buyer, amount_cents=5000, payment_intent_id="pi_refundme")
    paid = {"id": "pi_refundme", "object": "payment_intent", "amount": 5000,
            "amount_received": 5000, "metadata": {}}
    assert _deliver(_event(paid, "evt_paid")).status_code == 200
    assert ledger.wallet(user_id=buyer.pk).available == 50_000_000

    charge = {"id": "ch_1", "object": "charge", "payment_intent": "pi_refundme",
              "amount": 5000, "amount_refunded": 1000}
    for _ in range(2):  # the same refund delivered twice
        assert _deliver(_charge_event("charge.refunded", charge, "evt_ref1")).status_code == 200
    assert ledger.wallet(user_id=buyer.pk).available == 40_000_000
    # a second partial refund: amount_refunded is cumulative (1000 + 1500 cents)
    charge2 = {**charge, "amount_refunded": 2500}
    assert _deliver(_charge_event("charge.refunded", charge2, "evt_ref2")).status_code == 200
    assert ledger.wallet(user_id=buyer.pk).available == 25_000_000

    # the buyer spends 20 of the remaining 25 USD (held), then disputes the whole 50
    ledger.hold_place(buyer_id=buyer.pk, amount=20_000_000, reference="order:x")
    dispute = {"id": "dp_1", "object": "dispute", "charge": "ch_1",
               "payment_intent": "pi_refundme", "amount": 2500}
    assert _deliver(_charge_event("charge.dispute.created", dispute, "evt_dp")).status_code == 200
    assert _deliver(_charge_event("charge.dispute.created", dispute, "evt_dp_again")).status_code \
        == 200
    assert ledger.wallet(user_id=buyer.pk).available == 0
    from settlement.models import Account

    debt = Account.objects.get(kind="buyer_debt", owner=buyer)
    assert debt.balance == -20_000_000  # 25 disputed, 5 were still available
    # we win the dispute: the debt is cleared first, the rest returns to the wallet
    assert _deliver(_charge_event("charge.dispute.funds_reinstated", dispute,
                                  "evt_dp_won")).status_code == 200
    debt.refresh_from_db()
    assert debt.balance == 0
    assert ledger.wallet(user_id=buyer.pk).available == 5_000_000
    assert first_violation(LEDGER_CHECKS) is None


@pytest.mark.django_db
def test_a_later_top_up_repays_the_debt_first(stripe_on):
    from settlement.models import Account

    buyer = UserFactory()
    TopUp.objects.create(buyer=buyer, amount_cents=1000, payment_intent_id="pi_debt")
    paid = {"id": "pi_debt", "object": "payment_intent", "amount": 1000,
            "amount_received": 1000, "metadata": {}}
    assert _deliver(_event(paid, "evt_debt_paid")).status_code == 200
    ledger.hold_place(buyer_id=buyer.pk, amount=10_000_000, reference="order:y")  # all spent
    dispute = {"id": "dp_2", "object": "dispute", "charge": "ch_2",
               "payment_intent": "pi_debt", "amount": 1000}
    assert _deliver(_charge_event("charge.dispute.created", dispute, "evt_dp2")).status_code \
        == 200
    assert Account.objects.get(kind="buyer_debt", owner=buyer).balance == -10_000_000

    TopUp.objects.create(buyer=buyer, amount_cents=2500, payment_intent_id="pi_later")
    later = {"id": "pi_later", "object": "payment_intent", "amount": 2500,
             "amount_received": 2500, "metadata": {}}
    assert _deliver(_event(later, "evt_later")).status_code == 200
    assert Account.objects.get(kind="buyer_debt", owner=buyer).balance == 0
    assert ledger.wallet(user_id=buyer.pk).available == 15_000_000
    assert first_violation(LEDGER_CHECKS) is None


@pytest.mark.django_db
def test_signatures_dated_beyond_the_tolerance_either_way_are_refused(stripe_on, settings):
    """The stripe library refuses only signatures older than the tolerance; one dated in
    the future beyond it (a replayable pre-signed payload, or a skewed clock) is refused
    too, and within the tolerance either way a delivery is applied."""
    settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS = 300
    buyer = UserFactory()
    TopUp.objects.create(buyer=buyer, amount_cents=1000, payment_intent_id="pi_clock")
    intent = {"id": "pi_clock", "object": "payment_intent", "amount": 1000,
              "amount_received": 1000, "metadata": {}}
    now = int(time.time())
    for why, at in (("future", now + 3600), ("past", now - 3600)):
        body = _event(intent, f"evt_clock_{why}")
        resp = APIClient().post("/api/v1/stripe/webhook/", body,
                                content_type="application/json",
                                HTTP_STRIPE_SIGNATURE=_signed(body, at=at))
        assert resp.status_code == 400, why
        assert "tolerance" in resp.json()["detail"], why
    assert ledger.wallet(user_id=buyer.pk).available == 0
    assert StripeEvent.objects.count() == 0 and JournalEntry.objects.count() == 0
    for why, at in (("a little ahead", now + 60), ("a little late", now - 60)):
        body = _event(intent, f"evt_clock_ok_{why}")
        resp = APIClient().post("/api/v1/stripe/webhook/", body,
                                content_type="application/json",
                                HTTP_STRIPE_SIGNATURE=_signed(body, at=at))
        assert resp.status_code == 200, why
    assert ledger.wallet(user_id=buyer.pk).available == 10_000_000
