"""A bid's checkpoint store (marketplace/checkpoints.py, api/checkpoint_field.py) against
moto's S3 server on 127.0.0.1 with credentials enforced (tests/support/s3.py): the bucket
is probed at bid time, the credentials are sealed, copied to the lease, handed in clear to
its runner only (prefix `<chain id>/`, `restore` for a continuation), and never shown;
every bad store is a 400 naming `checkpoint` with the reason, nothing written, no hold."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client
from django.utils import timezone

from marketplace import auctions, sealing
from marketplace.models import Lease, Order, SealedBid
from settlement import services as ledger
from tests.factories import ask, bid_body, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import login
from tests.support.api import assert_refused, body_text, client_for, runner_client, snapshot
from tests.support.net import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _private_endpoints_allowed(settings):
    settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE = True  # moto listens on 127.0.0.1


@pytest.fixture
def store(s3_server):
    bucket = s3_server.bucket("ckpt-bids")
    return {"url": f"s3://{bucket}/runs", "endpoint_url": s3_server.endpoint_url,
            "access_key_id": s3_server.access_key_id,
            "secret_access_key": s3_server.secret_access_key}


def _market():
    provider, node, token = registered_node()
    buyer = funded_buyer(100)
    ask(provider, node, price=2_000_000)
    return provider, node, token, buyer


def _post_bid(buyer, **changes):
    return client_for(buyer).post("/api/v1/orders/", bid_body(**{"gpus": 1, **changes}),
                                  format="json")


def test_a_checkpoint_store_is_probed_sealed_copied_and_opened_for_the_runner_only(store):
    provider, _, token, buyer = _market()
    r = _post_bid(buyer, checkpoint={**store, "max_bytes": 1_000_000})
    assert r.status_code == 201, r.content
    secret = store["secret_access_key"]
    assert r.json()["checkpoint"] == {
        "url": store["url"], "endpoint_url": store["endpoint_url"], "region": "",
        "path": "/workspace/checkpoint", "max_bytes": 1_000_000, "credentials": "set"}
    assert secret not in body_text(r) and store["access_key_id"] not in body_text(r)
    (lease_id,) = r.json()["leases"]
    order, lease = Order.objects.get(pk=r.json()["id"]), Lease.objects.get(pk=lease_id)
    for sealed in (order.checkpoint_sealed, lease.checkpoint_sealed):
        assert secret not in sealed and sealing.unseal(sealed)["secret_access_key"] == secret
    assert secret not in str(order.checkpoint) + str(lease.checkpoint)
    for user in (buyer, provider):
        shown = client_for(user).get(f"/api/v1/leases/{lease_id}/")
        assert shown.json()["checkpoint"]["credentials"] == "set"
        assert shown.json()["checkpoints"] == [] and secret not in body_text(shown)

    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["chain_id"] == lease_id
    assert listed["checkpoint"] == {
        "endpoint_url": store["endpoint_url"], "bucket": "ckpt-bids",
        "prefix": f"runs/{lease_id}/", "region": "", "access_key_id": store["access_key_id"],
        "secret_access_key": secret, "path": "/workspace/checkpoint", "max_bytes": 1_000_000,
        "restore": False}


def test_a_continuation_restores_from_its_chains_prefix(store):
    _, _, token, buyer = _market()
    first = _post_bid(buyer, checkpoint=store).json()["leases"][0]
    second = _post_bid(buyer, checkpoint=store, gpus=1)
    assert second.status_code == 201, second.content
    (lease_id,) = second.json()["leases"]
    # in the first lease's chain, as failover makes a continuation (which also sets
    # `continues`, for a lease failed by the provider on another node: checks.py)
    Lease.objects.filter(pk=lease_id).update(chain_id=first)
    listed = {x["id"]: x for x in runner_client(token).get("/api/v1/runner/leases/")
              .json()["leases"]}
    assert listed[lease_id]["chain_id"] == first
    assert listed[lease_id]["checkpoint"]["prefix"] == f"runs/{first}/"
    assert listed[lease_id]["checkpoint"]["restore"] is True
    assert listed[first]["checkpoint"]["restore"] is False


def test_a_sealed_bids_checkpoint_reaches_its_lease(store):
    provider, node, token = registered_node()
    buyer = funded_buyer(100)
    now = timezone.now()
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=now + timedelta(minutes=5))
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "1.50", "checkpoint": store}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["checkpoint"]["credentials"] == "set"
    assert store["secret_access_key"] not in body_text(r)
    assert SealedBid.objects.get().checkpoint["url"] == store["url"]
    auctions.close_auction(auction_id=lot.pk, now=now + timedelta(minutes=6))
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["checkpoint"]["secret_access_key"] == store["secret_access_key"]


class _HtmlHandler(BaseHTTPRequestHandler):
    def _page(self):
        body = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = _page

    def log_message(self, *args):
        pass


@pytest.fixture
def html_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("case", "field", "words"), [
    ("unreachable", "checkpoint", "unreachable"),
    ("wrong_secret", "checkpoint", "refused the credentials"),
    ("no_bucket", "checkpoint", "no bucket nosuch-bucket"),
    ("not_s3", "checkpoint", "does not answer as an S3-compatible server"),
    ("not_http", "checkpoint.endpoint_url", "http:// or https://"),
    ("bad_url", "checkpoint.url", "s3://bucket"),
    ("outside_workspace", "checkpoint.path", "under /workspace"),
    ("max_bytes", "checkpoint.max_bytes", "whole number of bytes"),
    ("no_secret", "checkpoint.secret_access_key", "required"),
    ("unknown_key", "checkpoint", "unknown key 'token'"),
])
def test_a_bad_store_is_refused_naming_checkpoint_with_nothing_written(
        store, html_server, case, field, words):
    _, _, _, buyer = _market()
    cp = {**store}
    if case == "unreachable":
        cp["endpoint_url"] = f"http://127.0.0.1:{free_port()}"
    elif case == "wrong_secret":
        cp["secret_access_key"] = "not-the-secret-" + "x" * 20
    elif case == "no_bucket":
        cp["url"] = "s3://nosuch-bucket/runs"
    elif case == "not_s3":
        cp["endpoint_url"] = html_server
    elif case == "not_http":
        cp["endpoint_url"] = "file:///etc/passwd"
    elif case == "bad_url":
        cp["url"] = "https://ckpt-bids/runs"
    elif case == "outside_workspace":
        cp["path"] = "/workspace/../etc"
    elif case == "max_bytes":
        cp["max_bytes"] = "10GB"
    elif case == "no_secret":
        del cp["secret_access_key"]
    else:
        cp["token"] = "x"
    before = snapshot(buyer)
    r = _post_bid(buyer, checkpoint=cp)
    assert_refused(r, field, contains=words)
    assert snapshot(buyer) == before
    assert store["secret_access_key"] not in body_text(r)


def test_a_private_endpoint_is_refused_unless_the_setting_allows_it(store, settings):
    settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE = False
    _, _, _, buyer = _market()
    before = snapshot(buyer)
    r = _post_bid(buyer, checkpoint=store)
    assert_refused(r, "checkpoint", contains="private or local address")
    assert snapshot(buyer) == before


def test_an_ask_with_a_checkpoint_is_refused(store):
    provider, node, _ = registered_node()
    before = snapshot(provider)
    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "gpus": 1, "price": "2.00",
        "available_until": (timezone.now() + timedelta(hours=5)).isoformat(),
        "checkpoint": store}, format="json")
    assert_refused(r, "checkpoint", contains="is for bids")
    assert snapshot(provider) == before


def test_the_runner_reports_checkpoints_as_lease_events_the_api_lists(store):
    _, _, token, buyer = _market()
    (lease_id,) = _post_bid(buyer, checkpoint=store).json()["leases"]
    runner = runner_client(token)
    at = timezone.now().isoformat()
    r = runner.post(f"/api/v1/runner/leases/{lease_id}/checkpoints/", {
        "status": "uploaded", "reason": "stop", "at": at, "bytes": 2048, "files": 2,
        "seconds": 0.25, "key": f"runs/{lease_id}/x/manifest.json"}, format="json")
    assert r.status_code == 200, r.content
    r = runner.post(f"/api/v1/runner/leases/{lease_id}/checkpoints/", {
        "status": "failed", "reason": "notice", "at": at,
        "message": f"denied with {store['secret_access_key']}"}, format="json")
    assert r.status_code == 200, r.content
    shown = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    assert [(c["status"], c["reason"], c["bytes"]) for c in shown["checkpoints"]] == [
        ("uploaded", "stop", 2048), ("failed", "notice", 0)]
    assert store["secret_access_key"] not in str(shown)
    causes = [e["cause"] for e in shown["events"]]
    assert "checkpoint uploaded at stop: 2 files, 2.0 KiB in 0.2 s" in causes
    # the leases page: the bucket and the last reports, never a credential
    page = Client()
    login(page, buyer)
    html = page.get("/leases/").content.decode()
    assert "checkpoints to <code>s3://ckpt-bids/runs</code>" in html
    assert "checkpoint uploaded at stop: 2 files, 2.0 KiB in 0.2 s" in html
    assert store["secret_access_key"] not in html and store["access_key_id"] not in html
    bad = runner.post(f"/api/v1/runner/leases/{lease_id}/checkpoints/",
                      {"status": "lost", "reason": "stop", "at": at}, format="json")
    assert_refused(bad, "status")


def test_a_restore_that_failed_fails_the_lease_before_it_runs_and_charges_nothing(store):
    _, _, token, buyer = _market()
    before = ledger.wallet(user_id=buyer.pk)
    (lease_id,) = _post_bid(buyer, checkpoint=store).json()["leases"]
    runner = runner_client(token)
    assert runner.post(f"/api/v1/runner/leases/{lease_id}/events/", {"status": "starting"},
                       format="json").status_code == 200
    cause = "checkpoint restore failed: ClientError: SignatureDoesNotMatch"
    r = runner.post(f"/api/v1/runner/leases/{lease_id}/events/",
                    {"status": "failed", "cause": cause}, format="json")
    assert r.status_code == 200, r.content
    lease = Lease.objects.get(pk=lease_id)
    assert (lease.status, lease.cause, lease.cost, lease.started_at) == (
        "failed", cause, 0, None)
    assert ledger.wallet(user_id=buyer.pk) == before  # the whole hold came back
