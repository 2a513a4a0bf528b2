"""The market's and settlement's after-commit points emit their webhook events in the
same transaction (one event + one pending delivery per subscribed endpoint): fills,
sealed auctions won and lost, preemption notices, lease started/stopped/failed with the
cause, health findings, top-ups credited and payouts paid."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import auctions, book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from settlement import services as ledger
from settlement.models import TopUp
from settlement.stripe_payments import credit_topup
from tests.factories import (
    RTX4090_DUMP,
    UserFactory,
    api_token,
    funded_buyer,
    in_a_day,
    registered_node,
)
from tests.marketplace.preemption_support import full_node, notice_period  # noqa: F401
from tests.settlement.stripe_connect_standin import ConnectStandIn
from webhooks import services
from webhooks.events import EVENT_TYPES
from webhooks.models import WebhookDelivery, WebhookEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("allow_private")]
EVERY = sorted(t for t in EVENT_TYPES if t != "webhook.test")


def _subscribe(user, events=EVERY):
    endpoint, _ = services.create_endpoint(user_id=user.pk, url="http://127.0.0.1:9/",
                                           events=list(events))
    return endpoint


def _events(user, type=None):
    rows = WebhookEvent.objects.filter(user=user).order_by("created_at", "id")
    return [e for e in rows if type is None or e.type == type]


def test_a_fill_and_its_lease_tell_buyer_and_provider_each_step():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    endpoint = _subscribe(buyer)
    _subscribe(provider)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=8, available_until=in_a_day()).order
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_500_000, gpus=2, duration_seconds=3600).leases
    [filled] = _events(buyer, "order.filled")
    assert filled.payload | {"order": 0} == {
        "order": 0, "side": "bid", "status": "filled", "fill": lease.fill_id,
        "lease": lease.pk, "gpus": 2, "price_usd_micros": 2_000_000, "remaining_gpus": 0}
    [sold] = _events(provider, "order.filled")
    assert (sold.payload["order"], sold.payload["side"], sold.payload["remaining_gpus"]) == (
        ask.pk, "ask", 6)
    assert WebhookDelivery.objects.filter(event=filled, endpoint=endpoint,
                                          status="pending").exists()

    t0 = timezone.now()
    mark_running(lease=lease, container_id="c" * 64, now=t0)
    [started] = _events(buyer, "lease.started")
    assert started.payload["lease"] == lease.pk and started.payload["status"] == "running"
    assert started.payload["started_at"] == t0.isoformat()
    end_lease(lease_id=lease.pk, status="completed", cause="container exited 0",
              now=t0 + timedelta(seconds=600))
    [stopped] = _events(buyer, "lease.stopped")
    assert (stopped.payload["status"], stopped.payload["cause"]) == ("completed",
                                                                    "container exited 0")
    assert stopped.payload["cost_usd_micros"] == 2_000_000 * 2 * 600 // 3600
    assert _events(provider, "lease.started") == []  # the buyer's lease events are theirs


def test_a_failed_lease_says_its_cause():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    _subscribe(buyer, ["lease.failed"])
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=1, duration_seconds=3600).leases
    mark_running(lease=lease, container_id="c" * 64)
    end_lease(lease_id=lease.pk, status="failed", cause="GPU fell off the bus (XID 79)")
    [failed] = _events(buyer)  # subscribed to lease.failed only
    assert failed.type == "lease.failed"
    assert failed.payload["cause"] == "GPU fell off the bus (XID 79)"


def test_a_sealed_auction_tells_the_winner_and_each_loser_only_their_own_bid():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice, bob = funded_buyer(100), funded_buyer(100)
    for who in (alice, bob):
        _subscribe(who)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_100_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    lost = auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk,
                                     price=1_300_000)
    won = auctions.place_sealed_bid(bidder_id=bob.pk, auction_id=auction.pk, price=1_450_000)
    assert WebhookEvent.objects.count() == 0  # nothing before close
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    [a] = _events(alice, "auction.lost")
    assert a.payload == {"auction": auction.pk, "sealed_bid": lost.pk, "status": "lost",
                         "cause": "lost", "gpus": 0, "price_usd_micros": None}
    [b] = _events(bob, "auction.won")
    assert b.payload == {"auction": auction.pk, "sealed_bid": won.pk, "status": "won",
                         "cause": "won", "gpus": 8, "price_usd_micros": 1_300_000}
    assert "1450000" not in str(a.payload) and "1_450_000" not in str(a.payload)


def test_a_preempted_buyer_is_told_the_deadline_at_once():
    t0 = timezone.now() - timedelta(minutes=30)
    _provider, _node, _token, _ask, (high, _), (low, low_lease) = full_node(t0)
    _subscribe(low)
    _subscribe(high)
    buyer = funded_buyer(100)
    book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=3_000_000, gpus=4,
                   duration_seconds=3600, now=t0 + timedelta(seconds=1000))
    [notice] = _events(low, "lease.preemption_notice")
    low_lease.refresh_from_db()
    assert notice.payload["lease"] == low_lease.pk
    assert notice.payload["preempt_at"] == low_lease.preempt_at.isoformat()
    assert _events(high, "lease.preemption_notice") == []


def test_a_health_finding_tells_the_provider_and_the_buyer_of_that_gpu_only(
        django_capture_on_commit_callbacks):
    provider, node, token = registered_node()
    other = funded_buyer(100)
    buyer = funded_buyer(100)
    for who in (provider, buyer, other):
        _subscribe(who)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_000_000, gpus=1, duration_seconds=3600).leases
    book.place_bid(buyer_id=other.pk, market_slug="h100-sxm-80gb", price=2_000_000, gpus=1,
                   duration_seconds=3600)
    sick = lease.lease_gpus.get().gpu
    fatal = [{"uuid": sick.uuid, "rule": "xid", "severity": "fatal",
              "evidence": "XID 79 GPU has fallen off the bus"}]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post("/api/v1/runner/heartbeat/", {"runtime": "docker", "gpus": [],
                                                   "findings": fatal}, format="json")
    assert r.status_code == 200, r.content
    [mine] = _events(buyer, "health.finding")
    assert mine.payload["lease"] == lease.pk
    [gpu] = mine.payload["gpus"]
    assert (gpu["uuid"], gpu["healthy"]) == (sick.uuid, False)
    assert gpu["findings"][0]["evidence"] == "XID 79 GPU has fallen off the bus"
    [theirs] = _events(provider, "health.finding")
    assert theirs.payload["node"] == node.pk and "lease" not in theirs.payload
    assert _events(other, "health.finding") == []


def test_a_credited_top_up_is_told_once():
    buyer = UserFactory()
    _subscribe(buyer, ["topup.credited"])
    topup = TopUp.objects.create(buyer=buyer, amount_cents=2500, payment_intent_id="pi_hook")
    credit_topup(topup, 2500)
    credit_topup(topup, 2500)  # a duplicated Stripe webhook changes nothing
    [event] = _events(buyer)
    assert event.payload == {"topup": topup.pk, "amount_usd_micros": 25_000_000}


@pytest.mark.ledger("ledger_only")
def test_a_paid_payout_is_told(settings):
    standin = ConnectStandIn()
    standin.thread.start()
    settings.STRIPE_SECRET_KEY, settings.STRIPE_API_BASE = "sk_test_gpumarket", standin.url
    try:
        buyer, provider = funded_buyer(1000), UserFactory()
        hold = ledger.hold_place(buyer_id=buyer.pk, amount=2_000_000, reference="order:x")
        ledger.hold_settle(hold_id=hold.pk, cost=2_000_000, provider_id=provider.pk,
                           reference="lease:x")
        _subscribe(provider, ["payout.paid"])
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(provider)}")
        api.post("/api/v1/payouts/connect/")
        r = api.post("/api/v1/payouts/")
        assert r.status_code == 201 and r.json()["status"] == "paid", r.content
    finally:
        standin.server.shutdown()
        standin.server.server_close()
    [event] = _events(provider)
    assert event.type == "payout.paid"
    assert event.payload["amount_usd_micros"] == 1_700_000  # 85 % of 2 USD, whole cents


def test_a_resting_bid_is_told_when_a_better_bid_takes_the_new_asks_gpus():
    provider, node, _ = registered_node()
    better, outbid, cheap = funded_buyer(100), funded_buyer(100), funded_buyer(100)
    for who in (better, outbid, cheap):
        _subscribe(who)
    rest = {}
    for who, price in ((better, 3_000_000), (outbid, 2_500_000), (cheap, 1_000_000)):
        rest[who.pk] = book.place_bid(buyer_id=who.pk, market_slug="h100-sxm-80gb",
                                      price=price, gpus=8, duration_seconds=3600).order
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=2_000_000, gpus=8, available_until=in_a_day()).order
    assert [e.type for e in _events(better)] == ["order.filled"]
    [told] = _events(outbid)
    assert told.type == "order.outbid"
    assert told.payload == {"order": rest[outbid.pk].pk, "ask": ask.pk,
                            "price_usd_micros": 2_000_000, "remaining_gpus": 8}
    assert _events(cheap) == []  # it could not pay that ask: not outbid
