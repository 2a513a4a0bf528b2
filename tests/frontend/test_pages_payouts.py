"""Payouts in the provider portal: Stripe Connect status and onboarding link, "withdraw"
(whole cents, the sub-cent rest shown and kept), payout history with its states, retry
of a pending payout. Stripe Connect is the recorded stand-in of the settlement tests
(tests/settlement/stripe_connect_standin.py: localstripe has no Connect)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from providers.services import provider_onboard
from settlement import services as ledger
from settlement.checks import LEDGER_CHECKS, first_violation
from settlement.models import Payout
from tests.factories import UserFactory, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import login
from tests.settlement.test_stripe_payouts import standin  # noqa: F401 (fixture)

# earnings made by a settled hold without a market lease: the ledger's own checks only
pytestmark = [pytest.mark.django_db, pytest.mark.ledger("ledger_only")]


def _earning(provider, micros: int) -> None:
    """`provider` earns exactly `micros` (85 % of a settled hold's cost)."""
    buyer = funded_buyer(1000)
    cost = micros * 10_000 // 8_500 + 1
    while cost - cost * 1500 // 10_000 != micros:
        cost -= 1
    hold = ledger.hold_place(buyer_id=buyer.pk, amount=cost, reference="order:x")
    ledger.hold_settle(hold_id=hold.pk, cost=cost, provider_id=provider.pk,
                       reference="lease:x")
    assert ledger.wallet(user_id=provider.pk).earned == micros


def _text(html: str, id_: str) -> str:
    m = re.search(rf'id="{id_}"[^>]*>(.*?)</(p|table)>', html, re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", m.group(1))).strip() if m else ""


def test_connect_withdraw_and_history(client, standin):  # noqa: F811
    provider, _, _ = registered_node()
    login(client, provider)
    _earning(provider, 12_345_678)
    html = client.get(reverse("portal")).content.decode()
    assert _text(html, "connect-status") == "Stripe payouts: not set up"
    assert "withdraw-form" not in html  # not before a connected account

    r = client.post(reverse("payout-connect"))
    assert r.status_code == 302 and r["Location"].startswith("https://connect.stripe.com/")
    html = client.get(reverse("portal")).content.decode()
    assert _text(html, "connect-status") == "Stripe payouts: onboarding not finished"
    assert "Finish Stripe onboarding" in html
    [acct] = standin.accounts.values()  # the provider finishes Stripe's hosted onboarding
    acct.update(details_submitted=True, payouts_enabled=True)
    html = client.get(reverse("portal")).content.decode()
    assert _text(html, "connect-status") == "Stripe payouts: payouts enabled"
    assert _text(html, "withdraw-preview") == \
        "Withdraw $12.34; $0.005678 stays (payouts are in whole cents)."

    r = client.post(reverse("payout-withdraw"))
    assert r.status_code == 302 and r["Location"].endswith("#payouts")
    payout = Payout.objects.get()
    assert (payout.status, payout.amount_cents) == ("paid", 1234)
    assert [t["form"]["amount"] for t in standin.transfers()] == ["1234"]
    assert ledger.wallet(user_id=provider.pk).earned == 5_678
    html = client.get(reverse("portal")).content.decode()
    assert "$12.34 sent to your Stripe account; $0.005678 stays in your balance" in html
    assert re.search(rf'id="payout-{payout.pk}">.*?\$12\.34.*?>paid<', html, re.S)
    assert "Nothing to withdraw: $0.005678 earned, less than one cent." in html
    # nothing left to pay: refused by name, nothing written, no transfer
    r = client.post(reverse("payout-withdraw"), follow=True)
    assert "No payout: nothing to pay out: less than one cent earned." in r.content.decode()
    assert Payout.objects.count() == 1 and len(standin.transfers()) == 1
    assert first_violation(LEDGER_CHECKS) is None


def test_failed_and_pending_payouts_show_their_state(client, standin):  # noqa: F811
    provider, _, _ = registered_node()
    login(client, provider)
    _earning(provider, 5_000_000)
    client.post(reverse("payout-connect"))
    standin.fail_transfers = True
    html = client.post(reverse("payout-withdraw"), follow=True).content.decode()
    failed = Payout.objects.get()
    assert failed.status == "failed" and "insufficient available funds" in html
    assert re.search(rf'id="payout-{failed.pk}">.*?>failed<', html, re.S)
    assert ledger.wallet(user_id=provider.pk).earned == 5_000_000  # as it was

    standin.fail_transfers = False
    standin.drop_next_transfer = True
    client.post(reverse("payout-withdraw"))
    second = Payout.objects.exclude(pk=failed.pk).get()
    if second.status == "pending":  # the library gave up: shown pending, with a retry
        html = client.get(reverse("portal")).content.decode()
        assert re.search(rf'id="payout-{second.pk}">.*?>pending<.*?Retry', html, re.S)
        client.post(reverse("payout-retry", args=[second.pk]))
        second.refresh_from_db()
    assert second.status == "paid"
    assert ledger.wallet(user_id=provider.pk).earned == 0
    assert first_violation(LEDGER_CHECKS) is None


def test_connect_status_when_stripe_does_not_answer(client, standin):  # noqa: F811
    provider, _, _ = registered_node()
    login(client, provider)
    client.post(reverse("payout-connect"))
    standin.accounts.clear()  # Stripe answers 404 for the account
    html = client.get(reverse("portal")).content.decode()
    assert _text(html, "connect-status") == "Stripe payouts: Stripe did not answer"


def test_payout_pages_refuse_others_and_stripe_off(client, settings, standin):  # noqa: F811
    provider, _, _ = registered_node()
    other = UserFactory()
    provider_onboard(user_id=other.pk, display_name="Other GPUs")
    login(client, provider)
    _earning(other, 2_000_000)
    client.logout()
    login(client, other)
    client.post(reverse("payout-connect"))
    client.post(reverse("payout-withdraw"))
    theirs = Payout.objects.get()
    client.logout()
    login(client, provider)
    assert client.post(reverse("payout-retry", args=[theirs.pk])).status_code == 404
    assert client.get(reverse("payout-withdraw")).status_code == 405
    settings.STRIPE_SECRET_KEY = ""
    assert client.post(reverse("payout-withdraw")).status_code == 404
    assert "withdraw-form" not in client.get(reverse("portal")).content.decode()
