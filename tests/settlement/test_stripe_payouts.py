"""Provider payouts with Stripe Connect: the official `stripe` library against a
stand-in that serves recorded Connect responses (localstripe has no Connect)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from settlement import services as ledger
from settlement import stripe_payouts
from settlement.checks import LEDGER_CHECKS, first_violation
from settlement.models import Account, JournalEntry, Payout
from tests.factories import UserFactory, api_token, funded_buyer
from tests.settlement.stripe_connect_standin import ConnectStandIn

pytestmark = [pytest.mark.django_db, pytest.mark.ledger("ledger_only")]


@pytest.fixture
def standin(settings):
    s = ConnectStandIn()
    s.thread.start()
    settings.STRIPE_SECRET_KEY = "sk_test_gpumarket"
    settings.STRIPE_API_BASE = s.url
    yield s
    s.server.shutdown()
    s.server.server_close()


def _earning_provider(micros: int):
    """A provider that earned `micros` from a settled lease (85 % of the cost)."""
    buyer, provider = funded_buyer(1000), UserFactory()
    cost = micros * 10_000 // 8_500 + 1
    while cost - cost * 1500 // 10_000 != micros:
        cost -= 1
    hold = ledger.hold_place(buyer_id=buyer.pk, amount=cost, reference="order:x")
    ledger.hold_settle(hold_id=hold.pk, cost=cost, provider_id=provider.pk,
                       reference="lease:x")
    assert ledger.wallet(user_id=provider.pk).earned == micros
    return provider


def _api(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return api


def test_onboarding_creates_the_account_once_and_returns_a_link(standin):
    provider = UserFactory()
    api = _api(provider)
    first = api.post("/api/v1/payouts/connect/")
    second = api.post("/api/v1/payouts/connect/")
    assert first.status_code == second.status_code == 200
    assert first.json()["url"].startswith("https://connect.stripe.com/setup/")
    creates = [r for r in standin.requests if r["path"] == "/v1/accounts"]
    assert len(creates) == 1
    assert creates[0]["key"] == f"gpumarket-connect-{provider.pk}"


def test_payout_in_whole_cents_with_our_idempotency_key(standin):
    provider = _earning_provider(1_234_567)
    api = _api(provider)
    api.post("/api/v1/payouts/connect/")
    r = api.post("/api/v1/payouts/")
    assert r.status_code == 201, r.content
    assert r.json()["status"] == "paid" and r.json()["amount"] == "1.230000"
    [transfer] = standin.transfers()
    payout = Payout.objects.get()
    assert transfer["form"]["amount"] == "123"
    assert transfer["key"] == f"gpumarket-payout-{payout.pk}"
    assert payout.transfer_id.startswith("tr_standin")
    assert ledger.wallet(user_id=provider.pk).earned == 4_567  # the sub-cent rest stays
    assert first_violation(LEDGER_CHECKS) is None


def test_failed_transfer_leaves_the_balances_as_they_were(standin):
    provider = _earning_provider(5_000_000)
    api = _api(provider)
    api.post("/api/v1/payouts/connect/")
    standin.fail_transfers = True
    before = {a.pk: a.balance for a in Account.objects.all()}
    r = api.post("/api/v1/payouts/")
    assert r.status_code == 201
    assert r.json()["status"] == "failed"
    assert "insufficient available funds" in r.json()["failure"]
    after = {a.pk: a.balance for a in Account.objects.all()}
    assert {k: v for k, v in after.items() if k in before} == before
    assert all(v == 0 for k, v in after.items() if k not in before)
    assert ledger.wallet(user_id=provider.pk).earned == 5_000_000
    assert first_violation(LEDGER_CHECKS) is None


def test_network_error_then_retry_pays_once_with_the_same_key(standin):
    provider = _earning_provider(2_000_000)
    stripe_payouts.connect_onboard(user_id=provider.pk, return_url="http://127.0.0.1/",
                                   refresh_url="http://127.0.0.1/")
    standin.drop_next_transfer = True
    payout = stripe_payouts.payout_create(provider_id=provider.pk)
    if payout.status == "pending":  # the library gave up: money is in flight, not lost
        in_flight = Account.objects.get(kind="provider_payout_pending", owner=provider)
        assert in_flight.balance == 2_000_000
        payout = stripe_payouts.payout_retry(payout_id=payout.pk)
    assert payout.status == "paid"
    keys = {t["key"] for t in standin.transfers()}
    assert keys == {f"gpumarket-payout-{payout.pk}"}
    assert len({t for t in standin.by_key if t.startswith("gpumarket-payout")}) == 1
    assert JournalEntry.objects.filter(kind="payout_sent").count() == 1
    assert ledger.wallet(user_id=provider.pk).earned == 0
    assert first_violation(LEDGER_CHECKS) is None


def test_refusals_write_nothing(standin):
    provider = _earning_provider(9_999)  # less than one cent
    api = _api(provider)
    r = api.post("/api/v1/payouts/")
    assert r.status_code == 409 and "connected account" in r.json()["detail"]
    api.post("/api/v1/payouts/connect/")
    r = api.post("/api/v1/payouts/")
    assert r.status_code == 409 and "less than one cent" in r.json()["detail"]
    assert Payout.objects.count() == 0 and standin.transfers() == []
