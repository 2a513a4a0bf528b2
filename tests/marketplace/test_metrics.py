"""The marketplace's /metrics (marketplace/metrics_view.py, core/metrics.py): who may read
it, and that the market's own actions move its series — the real services, the real
database, prometheus_client's own parser on the answer."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from marketplace import auctions, book, lease_end, leases
from marketplace.models import Lease
from providers import services as provider_services
from settlement.models import Account
from settlement.services import InsufficientFunds
from settlement.tasks import ledger_check
from tests.factories import H100, RTX4090_DUMP, ask, bid, funded_buyer, registered_node

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def token(settings):
    settings.GPUMARKET_METRICS_TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
    settings.GPUMARKET_METRICS_ALLOW = []
    return TOKEN


def scrape(client, token: str = TOKEN) -> dict[tuple, float]:
    """/metrics as {(sample name, ((label, value), …)): value}."""
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200, answer.content[:200]
    assert answer["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.content.decode())
            for s in family.samples}


def value(samples, metric: str, /, **labels) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


def test_off_without_a_token_or_an_allowlist(client, settings):
    settings.GPUMARKET_METRICS_TOKEN_SHA256, settings.GPUMARKET_METRICS_ALLOW = "", []
    answer = client.get("/metrics")
    assert answer.status_code == 404
    assert b"gpumarket_" not in answer.content


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer "])
def test_a_scrape_without_the_token_is_refused_and_shows_nothing(client, token, header):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    answer = client.get("/metrics", **extra)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == 'Bearer realm="gpumarket metrics"'
    assert b"gpumarket_" not in answer.content and b"celery_" not in answer.content
    assert TOKEN.encode() not in answer.content


def test_the_token_reads_the_metrics_and_never_shows_itself(client, token):
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 200
    assert b"# TYPE gpumarket_heartbeats_total counter" in answer.content
    assert TOKEN.encode() not in answer.content
    assert hashlib.sha256(TOKEN.encode()).hexdigest().encode() not in answer.content


def test_an_allowed_network_reads_without_a_token_and_others_are_refused(client, settings):
    settings.GPUMARKET_METRICS_TOKEN_SHA256 = ""
    settings.GPUMARKET_METRICS_ALLOW = [ipaddress.ip_network("127.0.0.0/8")]
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    settings.GPUMARKET_METRICS_ALLOW = [ipaddress.ip_network("10.0.0.0/8")]
    refused = client.get("/metrics")
    assert refused.status_code == 403 and b"gpumarket_" not in refused.content


def test_orders_fills_ledger_and_the_book_move_their_series(
        client, token, django_capture_on_commit_callbacks):
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        ask(provider, node, price=2_000_000, gpus=8)
        bid(buyer, price=2_500_000, gpus=2, duration_seconds=3600)  # fills 2 at 2.00
        bid(buyer, price=1_000_000, gpus=1, duration_seconds=3600)  # rests
        with pytest.raises(InsufficientFunds):
            bid(buyer, price=90_000_000, gpus=8, duration_seconds=3600)
    after = scrape(client)

    def delta(metric, /, **labels):
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert delta("gpumarket_orders_placed_total", side="ask") == 1
    assert delta("gpumarket_orders_placed_total", side="bid") == 2
    assert delta("gpumarket_orders_refused_total", side="bid",
                 reason="insufficient_funds") == 1
    assert delta("gpumarket_fills_total", market=H100, kind="continuous") == 1
    assert delta("gpumarket_traded_gpu_seconds_total", market=H100, kind="continuous") == 7200
    # held: the bids' holds (2 × 2.50 and 1 × 1.00) and the lease's hold at 2 × 2.00
    assert delta("gpumarket_ledger_held_usd_micros_total") == 5_000_000 + 1_000_000 + 4_000_000
    assert delta("gpumarket_bid_group_duration_seconds_count") == 3
    assert delta("gpumarket_matching_duration_seconds_count", side="bid") >= 1
    assert delta("gpumarket_market_lock_wait_seconds_count") >= 3
    assert value(after, "gpumarket_book_depth_gpus", market=H100, side="ask") == 6
    assert value(after, "gpumarket_book_depth_gpus", market=H100, side="bid") == 1
    assert value(after, "gpumarket_book_best_price_usd_micros", market=H100, side="ask") == 2e6
    assert value(after, "gpumarket_book_spread_usd_micros", market=H100) == 1_000_000
    assert value(after, "gpumarket_leases", state="pending") == 1
    assert value(after, "gpumarket_gpus", market=H100, health="healthy") == 8
    assert value(after, "gpumarket_node_last_heartbeat_timestamp_seconds",
                 node=str(node.pk)) == pytest.approx(node.last_heartbeat_at.timestamp(), abs=1)


def test_lease_start_handoff_failure_cause_and_captures(
        client, token, django_capture_on_commit_callbacks):
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    ask(provider, node, price=2_000_000, gpus=8)
    [lease] = bid(buyer, price=2_000_000, gpus=1, duration_seconds=3600).leases
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        leases.mark_running(lease=lease, container_id="c" * 64,
                            now=lease.created_at + timedelta(seconds=3))
        lease_end.end_lease(lease_id=lease.pk, status="failed",
                            cause=f"node {node.name} missed heartbeats since …",
                            now=lease.created_at + timedelta(seconds=3603))
    after = scrape(client)

    def delta(metric, /, **labels):
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert delta("gpumarket_lease_starts_total", market=H100) == 1
    assert delta("gpumarket_lease_handoff_seconds_count") == 1
    assert delta("gpumarket_lease_handoff_seconds_sum") == pytest.approx(3)
    assert delta("gpumarket_leases_ended_total", state="failed") == 1
    assert delta("gpumarket_lease_failures_total", cause="node_silent") == 1
    lease = Lease.objects.get(pk=lease.pk)
    assert delta("gpumarket_ledger_captured_usd_micros_total") == lease.cost == 2_000_000
    assert delta("gpumarket_ledger_fees_usd_micros_total") == lease.platform_fee == 300_000


def test_heartbeats_and_late_heartbeats_are_counted(client, token, settings):
    settings.GPUMARKET_METRICS_HEARTBEAT_LATE_SECONDS = 30
    _, node, _ = registered_node()
    before = scrape(client)
    provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])  # on time
    node.last_heartbeat_at = timezone.now() - timedelta(seconds=45)
    provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])  # late
    after = scrape(client)
    assert value(after, "gpumarket_heartbeats_total") - value(
        before, "gpumarket_heartbeats_total") == 2
    assert value(after, "gpumarket_heartbeats_late_total") - value(
        before, "gpumarket_heartbeats_late_total") == 1


def test_stripe_webhook_outcomes_are_counted(client, token, settings):
    settings.STRIPE_SECRET_KEY = settings.STRIPE_WEBHOOK_SECRET = ""
    before = scrape(client)
    answer = client.post("/api/v1/stripe/webhook/", data=b"{}", content_type="application/json",
                         HTTP_STRIPE_SIGNATURE="t=1,v1=00")
    assert answer.status_code == 404  # Stripe is off here
    after = scrape(client)
    assert value(after, "gpumarket_stripe_webhooks_total", outcome="disabled") - value(
        before, "gpumarket_stripe_webhooks_total", outcome="disabled") == 1


@pytest.mark.ledger("violates")
def test_the_ledger_check_task_exports_its_result_and_celery_counts_it(client, token):
    before = scrape(client)
    assert ledger_check.apply().get() == {"ok": True, "violation": None}
    ok = scrape(client)
    assert value(ok, "gpumarket_ledger_check_ok") == 1
    assert value(ok, "gpumarket_ledger_check_last_run_timestamp_seconds") > 0
    name = {"name": "settlement.tasks.ledger_check", "hostname": socket.gethostname()}
    assert value(ok, "celery_task_succeeded_total", **name) - value(
        before, "celery_task_succeeded_total", **name) == 1
    assert value(ok, "celery_task_runtime_count", **name) - value(
        before, "celery_task_runtime_count", **name) == 1

    funded_buyer(5)
    Account.objects.filter(kind="buyer_available").update(balance=1)  # off its postings
    assert ledger_check.apply().get()["ok"] is False
    assert value(scrape(client), "gpumarket_ledger_check_ok") == 0


def test_other_processes_counters_add_up_and_dead_ones_live_gauges_go(client, token):
    """Multi-process mode: a child process writes into the same PROMETHEUS_MULTIPROC_DIR;
    its counter stays after it exits, its feed-client gauge does not."""
    before = scrape(client)
    code = ("import django; django.setup(); from core import metrics; "
            "metrics.LEDGER_FEES.inc(7); metrics.feed_client('market.x', +3)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "DJANGO_SETTINGS_MODULE": "marketplace.settings"})
    after = scrape(client)
    assert value(after, "gpumarket_ledger_fees_usd_micros_total") - value(
        before, "gpumarket_ledger_fees_usd_micros_total") == 7
    assert value(after, "gpumarket_feed_clients", channel="market") == value(
        before, "gpumarket_feed_clients", channel="market")


def test_a_sealed_auction_close_counts_its_fill(client, token, django_capture_on_commit_callbacks):
    provider, node, _ = registered_node(RTX4090_DUMP)
    buyer = funded_buyer(100)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_100_000, duration_seconds=1800,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk, price=1_200_000)
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    after = scrape(client)
    market = auction.market.slug
    assert value(after, "gpumarket_fills_total", market=market, kind="sealed") - value(
        before, "gpumarket_fills_total", market=market, kind="sealed") == 1
    assert value(after, "gpumarket_traded_gpu_seconds_total", market=market,
                 kind="sealed") - value(before, "gpumarket_traded_gpu_seconds_total",
                                        market=market, kind="sealed") == 8 * 1800


def test_a_replayed_client_order_id_places_nothing_and_counts_nothing(client, token):
    registered_node()
    buyer = funded_buyer(100)
    request = book.BidRequest(buyer_id=buyer.pk, market_slug=H100, price=1_000_000, gpus=1,
                              duration_seconds=3600, client_order_id="once")
    before = scrape(client)
    first, again = book.place_bids([request, request])  # the same id twice in one call
    assert first.created and not again.created
    book.place_bid(request)  # and once more alone
    after = scrape(client)
    assert value(after, "gpumarket_orders_placed_total", side="bid") - value(
        before, "gpumarket_orders_placed_total", side="bid") == 1
