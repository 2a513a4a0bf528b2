"""Shared helpers of the API tests: token clients, row counts, the public-view scanners."""

from __future__ import annotations

import json

from rest_framework.test import APIClient

from marketplace.models import Lease, Order, SealedBid
from settlement import services as ledger
from settlement.models import Hold, JournalEntry
from tests.factories import api_token


def client_for(user=None) -> APIClient:
    """An APIClient that answers 500s as responses (not raised) so a bug shows as a status."""
    client = APIClient()
    client.raise_request_exception = False
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


def runner_client(runner_token: str) -> APIClient:
    client = APIClient()
    client.raise_request_exception = False
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {runner_token}")
    return client


def snapshot(*users) -> dict:
    """Row counts of everything a refused request must not write, plus the users' wallets."""
    return {
        "orders": Order.objects.count(),
        "holds": Hold.objects.count(),
        "entries": JournalEntry.objects.count(),
        "leases": Lease.objects.count(),
        "sealed_bids": SealedBid.objects.count(),
        "wallets": {u.pk: ledger.wallet(user_id=u.pk) for u in users},
    }


def assert_refused(response, field: str, *, status: int = 400, contains: str | None = None):
    """The error shape of the API: a 4xx naming `field` in `errors` and in `detail`."""
    assert response.status_code == status, (response.status_code, _text(response))
    body = response.json()
    assert set(body) >= {"detail", "errors"}, body
    assert field in body["errors"], body
    assert body["errors"][field] and all(isinstance(m, str) for m in body["errors"][field])
    assert isinstance(body["detail"], str) and body["detail"]
    if contains is not None:
        assert any(contains in m for m in body["errors"][field]), body
    return body


def _text(response) -> str:
    return response.content.decode("utf-8", "replace")


def body_text(response) -> str:
    """The body as text (JSON re-dumped so both spellings of a value are searched)."""
    text = _text(response)
    if response.get("Content-Type", "").startswith("application/json"):
        text += json.dumps(response.json())
    return text

