"""The wallet history (page, CSV, API) after a Stripe top-up (a signed webhook, as
localstripe sends it), a bid's hold placed and released by a cancel, and a lease
settled: its totals and running balances are the ledger's accounts, and ledger_check
holds."""

from __future__ import annotations

import csv
import io
import itertools
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import book, lease_end, leases
from settlement import services as ledger
from settlement.models import TopUp
from settlement.money import parse_usd
from tests.factories import UserFactory, api_token, funded_buyer, in_a_day, registered_node
from tests.frontend.test_pages_buyer import MARKET, login
from tests.settlement.test_stripe_topups import (  # noqa: F401 (fixtures)
    _deliver,
    _event,
    localstripe_url,
    stripe_on,
)

pytestmark = pytest.mark.django_db


def _history_scenario():
    """A buyer topped up with $25 by Stripe, a bid cancelled, a lease of 100 s settled."""
    buyer = UserFactory()
    TopUp.objects.create(buyer=buyer, amount_cents=2500, payment_intent_id="pi_history")
    paid = {"id": "pi_history", "object": "payment_intent", "amount": 2500,
            "amount_received": 2500, "metadata": {}}
    assert _deliver(_event(paid, "evt_history")).status_code == 200
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=3_330_000, gpus=8, available_until=in_a_day())
    resting = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_000_000,
                             gpus=2, duration_seconds=3600)
    book.cancel_order(user_id=buyer.pk, order_id=resting.order.pk)
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_330_000, gpus=1,
                            duration_seconds=3600)
    lease = placed.leases[0]
    leases.mark_running(lease=lease, container_id="abc123")
    lease_end.end_lease(lease_id=lease.pk, status="completed", cause="time is up",
                        now=timezone.now() + timedelta(seconds=100))
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_000_000, gpus=1,
                   duration_seconds=3600)  # a hold still active: held is not zero
    return buyer


@pytest.mark.usefixtures("stripe_on")
def test_page_csv_and_api_totals_are_the_ledgers(client):
    buyer = _history_scenario()
    other = funded_buyer(7)  # someone else's money never shows
    call_command("ledger_check")  # exits non-zero on a violation
    w = ledger.wallet(user_id=buyer.pk)
    assert w.available and w.held

    login(client, buyer)
    r = client.get(reverse("wallet-history-page"))
    assert r.status_code == 200
    html = r.content.decode()
    total = {k: int(re.search(rf'id="total-{k}" data-micros="(-?\d+)"', html).group(1))
             for k in ("available", "held")}
    assert total == {"available": w.available, "held": w.held}
    from frontend.templatetags.gpumarket import usd
    assert 'id="balance-available" title="$' in html and f">{usd(w.available)}<" in html
    rows = [tuple(int(x) for x in m) for m in re.findall(
        r'data-available="(-?\d+)" data-held="(-?\d+)" data-available-after="(-?\d+)" '
        r'data-held-after="(-?\d+)"', html)]
    assert rows[0][2:] == (w.available, w.held)  # newest first
    for newer, older in itertools.pairwise(rows):  # each running balance is the one before
        assert newer[2] == older[2] + newer[0] and newer[3] == older[3] + newer[1]
    assert rows[-1][2:] == rows[-1][:2]
    for words in ("top-up (card)", "hold placed", "hold released", "lease charged"):
        assert words in html

    r = client.get(reverse("wallet-history-csv"))
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert len(table) == len(rows)
    assert sum(parse_usd_signed(x["available"]) for x in table) == w.available
    assert sum(parse_usd_signed(x["held"]) for x in table) == w.held
    assert parse_usd(table[0]["available_after"]) == w.available
    assert {x["kind"] for x in table} >= {"stripe_topup", "hold_place", "hold_release",
                                          "lease_settle"}
    assert str(other.pk) not in {x["reference"].removeprefix("user:") for x in table}

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(buyer)}")
    body = api.get("/api/v1/wallet/history/").json()
    assert body["count"] == len(table)
    assert [(x["id"], x["available"], x["held_after"]) for x in body["results"]] == \
        [(int(x["entry"]), x["available"], x["held_after"]) for x in table]
    holds = api.get("/api/v1/wallet/history/?kind=hold").json()["results"]
    assert holds and {x["kind"] for x in holds} <= {"hold_place", "hold_release",
                                                   "hold_reduce"}
    # a filter hides rows; the running balances shown stay the ledger's
    by_id = {x["id"]: x for x in body["results"]}
    assert all(by_id[x["id"]] == x for x in holds)


def parse_usd_signed(text: str) -> int:
    return -parse_usd(text[1:]) if text.startswith("-") else parse_usd(text)


def test_unknown_kind_is_refused_by_name(client):
    buyer = funded_buyer(1)
    login(client, buyer)
    r = client.get(reverse("wallet-history-page") + "?kind=bogus")
    assert r.status_code == 400 and "kind: must be one of" in r.content.decode()
    r = client.get(reverse("wallet-history-csv") + "?kind=bogus")
    assert r.status_code == 400 and b"kind" in r.content
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(buyer)}")
    r = api.get("/api/v1/wallet/history/?kind=bogus")
    assert r.status_code == 400 and "kind" in r.json()["errors"]
    r = api.get("/api/v1/wallet/history/?limit=0")
    assert r.status_code == 400 and "limit" in r.json()["errors"]


def test_paged_newest_first(client):
    buyer = UserFactory()
    for n in range(1, 56):
        ledger.dev_credit(user_id=buyer.pk, amount=n * 1_000_000)
    login(client, buyer)
    first = client.get(reverse("wallet-history-page")).content.decode()
    second = client.get(reverse("wallet-history-page") + "?page=2").content.decode()
    ids = lambda html: [int(x) for x in re.findall(r'<tr id="entry-(\d+)"', html)]  # noqa: E731
    assert len(ids(first)) == 50 and len(ids(second)) == 5
    assert ids(first) == sorted(ids(first), reverse=True) and max(ids(second)) < min(ids(first))
    assert 'rel="next"' in first and 'rel="prev"' in second
    # the oldest row's balance after it is the first credit; the newest is the sum
    assert f'data-available-after="{sum(range(1, 56)) * 1_000_000}"' in first
    assert 'data-available-after="1000000"' in second


def test_history_needs_a_login(client):
    r = client.get(reverse("wallet-history-csv"))
    assert r.status_code == 302 and "/login/" in r["Location"]
    assert APIClient().get("/api/v1/wallet/history/").status_code in (401, 403)


def test_the_page_reads_a_fixed_number_of_queries(client):
    """However many entries: session, user, totals with the count, one page, balances."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    buyer = UserFactory()
    login(client, buyer)
    counts = []
    for n in (3, 120):
        while ledger.wallet(user_id=buyer.pk).available < n * 1_000_000:
            ledger.dev_credit(user_id=buyer.pk, amount=1_000_000)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("wallet-history-page") + "?page=2").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
