"""The wallet API (settlement/api.py): the development credit switch, the wallet and its
ledger entries."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from settlement import services as ledger
from settlement.models import JournalEntry
from tests.factories import UserFactory
from tests.support.api import assert_refused, client_for

pytestmark = pytest.mark.django_db


def test_dev_credit_is_404_when_disabled(settings):
    settings.GPUMARKET_DEV_CREDIT = False
    user = UserFactory()
    entries = JournalEntry.objects.count()
    r = client_for(user).post("/api/v1/wallet/dev-credit/", {"amount": "50.00"}, format="json")
    assert r.status_code == 404
    assert "disabled" in r.json()["detail"]
    assert JournalEntry.objects.count() == entries
    assert ledger.wallet(user_id=user.pk).available == 0


def test_dev_credit_credits_when_enabled(settings):
    settings.GPUMARKET_DEV_CREDIT = True
    user = UserFactory()
    r = client_for(user).post("/api/v1/wallet/dev-credit/", {"amount": "50.25"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["available"] == "50.250000" and r.json()["held"] == "0.000000"
    assert ledger.wallet(user_id=user.pk).available == 50_250_000
    wallet = client_for(user).get("/api/v1/wallet/").json()
    assert wallet == {"available": "50.250000", "held": "0.000000", "earned": "0.000000",
                      "holds": []}
    entries = client_for(user).get("/api/v1/ledger/entries/").json()["results"]
    assert [e["kind"] for e in entries] == [JournalEntry.Kind.DEV_CREDIT]
    assert sum(int(p["amount"].replace(".", "")) for p in entries[0]["postings"]) == 0


@pytest.mark.parametrize("amount", ["0", "-5", 5, "NaN", "1e3", "1.0000001", "1000000.01"])
def test_dev_credit_bad_amount_changes_nothing(settings, amount):
    settings.GPUMARKET_DEV_CREDIT = True
    user = UserFactory()
    entries = JournalEntry.objects.count()
    r = client_for(user).post("/api/v1/wallet/dev-credit/", {"amount": amount}, format="json")
    assert_refused(r, "amount")
    assert JournalEntry.objects.count() == entries
    assert ledger.wallet(user_id=user.pk).available == 0


def test_dev_credit_needs_a_user(settings):
    settings.GPUMARKET_DEV_CREDIT = True
    r = APIClient().post("/api/v1/wallet/dev-credit/", {"amount": "5"}, format="json")
    assert r.status_code in (401, 403)
