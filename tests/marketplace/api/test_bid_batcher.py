"""The order endpoint's fast path under ASGI (marketplace/api/bid_batcher.py): bids with
an API token are grouped by the batcher and answered exactly as the DRF view answers
them; everything else reaches Django unchanged. Real PostgreSQL (the batcher thread has
its own connection, so the tests commit), the real ASGI application."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from marketplace.api import bid_batcher
from marketplace.asgi import application
from marketplace.models import Order
from settlement import services as ledger
from settlement.checks import first_violation
from tests.factories import api_token, ensure_catalog, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for

pytestmark = pytest.mark.django_db(transaction=True)

BID = {"side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 2, "hours": 1, "price": "2.10"}


@pytest.fixture(autouse=True)
def fresh_batcher():
    """A batcher per test, stopped afterwards (its thread closes its connection); the GPU
    class catalog (transactional tests flush the data migration's rows)."""
    ensure_catalog()
    bid_batcher._batcher = None
    yield
    if bid_batcher._batcher is not None:
        bid_batcher._batcher.stop()
    bid_batcher._batcher = None


def asgi_post(*requests: tuple[str | None, dict], host: str = "testserver",
              raw: bytes | None = None) -> list[httpx.Response]:
    """POST each (token, body) to /api/v1/orders/ through the ASGI app, all at once."""
    async def run():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            async def one(token, body):
                headers = {"Authorization": f"Token {token}"} if token else {}
                if raw is not None:
                    return await c.post("/api/v1/orders/", content=raw, headers={
                        **headers, "Content-Type": "application/json"})
                return await c.post("/api/v1/orders/", json=body, headers=headers)
            return await asyncio.gather(*(one(t, b) for t, b in requests))
    return asyncio.run(run())


def token_of(user) -> str:
    return api_token(user)


def without_ids(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created_at", "leases")}


def test_a_bid_through_the_batcher_answers_as_the_drf_view_does():
    buyer = funded_buyer(100)
    [fast] = asgi_post((token_of(buyer), BID))
    slow = client_for(buyer).post("/api/v1/orders/", BID, format="json")
    assert fast.status_code == slow.status_code == 201
    assert without_ids(fast.json()) == without_ids(slow.json())
    assert fast.json()["leases"] == [] and set(fast.json()) == set(slow.json())
    assert fast.headers["content-type"] == "application/json"
    assert fast.headers["x-content-type-options"] == "nosniff"
    assert fast.headers["x-frame-options"] == slow.headers["X-Frame-Options"]
    assert bid_batcher.batcher().stats["bids"] == 1


def test_a_revoked_or_expired_token_is_refused_on_the_fast_path_at_once():
    """The batcher looks tokens up by hash for every group: a token revoked or expired a
    moment ago places nothing, and the answer is the DRF view's 401 saying why."""
    from datetime import timedelta

    from django.utils import timezone

    from marketplace import api_tokens
    from marketplace.models import ApiToken

    buyer = funded_buyer(100)
    revoked, expired = api_tokens.issue(user=buyer), api_tokens.issue(user=buyer)
    first, second = asgi_post((revoked.key, BID), (expired.key, BID))
    assert first.status_code == second.status_code == 201
    assert first.headers["x-request-id"]
    assert bid_batcher.batcher().stats["bids"] == 2
    ApiToken.objects.filter(pk=revoked.token.pk).delete()
    ApiToken.objects.filter(pk=expired.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    gone, old = asgi_post((revoked.key, BID), (expired.key, BID))
    assert (gone.status_code, gone.json()) == (401, {"detail": "invalid token"})
    assert (old.status_code, old.json()) == (401, {"detail": "token expired"})
    assert Order.objects.filter(owner=buyer).count() == 2


def test_concurrent_bids_are_placed_in_one_group_and_each_gets_its_answer(monkeypatch,
                                                                          settings):
    """The batcher thread is held back until all 12 bids are queued, so they form one
    group; each caller still gets its own order (and a lease where it crossed the ask).
    (The process's own batcher; the Redis queue's groups: test_bid_queue.py.)"""
    settings.GPUMARKET_BID_QUEUE = "process"
    provider, node, _ = registered_node()
    client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "gpus": 2, "price": "2.20",
        "available_until": in_a_day().isoformat()}, format="json")
    buyers = [funded_buyer(100) for _ in range(6)]
    batcher = bid_batcher.batcher()
    real_ensure, real_queue = batcher._ensure_thread, batcher._queue

    class HeldQueue:
        """The batcher's queue, starting its thread only once 12 bids are in."""

        puts = 0

        def put(self, item):
            real_queue.put(item)
            HeldQueue.puts += 1
            if HeldQueue.puts == 12:
                real_ensure()

        def get(self):
            return real_queue.get()

        def get_nowait(self):
            return real_queue.get_nowait()

    monkeypatch.setattr(batcher, "_queue", HeldQueue())
    monkeypatch.setattr(batcher, "_ensure_thread", lambda: None)
    prices = ["2.00", "2.05", "2.30", "2.10", "2.15", "2.25"] * 2
    responses = asgi_post(*((token_of(buyers[i % 6]), {**BID, "gpus": 1, "price": p})
                            for i, p in enumerate(prices)))
    assert [r.status_code for r in responses] == [201] * 12
    assert batcher.stats == {"groups": 1, "bids": 12, "largest": 12}
    ids = [r.json()["id"] for r in responses]
    assert ids == sorted(ids)  # placed in arrival order
    # the ask (2 GPUs at 2.20) filled the first two bids at or above 2.20, in order
    filled = [r.json() for r in responses if r.json()["leases"]]
    assert [b["price"] for b in filled] == ["2.300000", "2.250000"]
    for r, price in zip(responses, prices, strict=True):
        order = Order.objects.get(pk=r.json()["id"])
        assert order.status == r.json()["status"] and f"{order.price / 1e6:.2f}" == price
    assert first_violation() is None


def test_refusals_come_back_with_the_drf_views_status_and_body():
    poor = funded_buyer(1)
    fast_broke, fast_bad = asgi_post((token_of(poor), BID),
                                     (token_of(poor), {**BID, "price": 2.1}))
    slow = client_for(poor)
    slow_broke = slow.post("/api/v1/orders/", BID, format="json")
    slow_bad = slow.post("/api/v1/orders/", {**BID, "price": 2.1}, format="json")
    assert fast_broke.status_code == slow_broke.status_code == 400
    assert fast_broke.json() == slow_broke.json()
    assert "insufficient balance" in fast_broke.json()["detail"]
    assert fast_bad.status_code == slow_bad.status_code == 400
    assert fast_bad.json() == slow_bad.json()
    assert Order.objects.count() == 0 and ledger.wallet(user_id=poor.pk).held == 0


def test_what_the_fast_path_cannot_answer_reaches_django():
    buyer = funded_buyer(100)
    provider, node, _ = registered_node()
    ask = {"side": "ask", "node": node.pk, "gpus": 1, "price": "3.00",
           "available_until": in_a_day().isoformat()}
    unknown, no_token, an_ask = asgi_post(("not-a-token", BID), (None, BID),
                                          (token_of(provider), ask))
    assert unknown.status_code == 401 and no_token.status_code == 401
    assert unknown.json() == {"detail": "invalid token"}
    assert an_ask.status_code == 201 and an_ask.json()["side"] == "ask"
    [bad_host] = asgi_post((token_of(buyer), BID), host="evil.example")
    assert bad_host.status_code == 400
    [not_json] = asgi_post((token_of(buyer), BID), raw=b'{"side": "bid", ')
    assert not_json.status_code == 400 and "JSON parse error" in not_json.json()["detail"]
    assert Order.objects.filter(side="bid").count() == 0
    assert bid_batcher._batcher is None or bid_batcher._batcher.stats["bids"] <= 1


def test_a_bid_of_every_field_answers_alike_both_ways_in_and_again_as_a_replay():
    """Every one of a bid's fields, given once through the DRF view and once through the
    batcher: the same 201 body (ids and times aside), the same order stored, the same
    leases made; placed again, the same 200 replay."""
    provider, node, _ = registered_node()
    client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "gpus": 4, "price": "2.00",
        "available_until": in_a_day().isoformat()}, format="json")
    bid = {"side": "bid", "gpu_class": "h100-sxm-80gb", "gpus": 2, "gang_size": 1,
           "duration_seconds": 5400, "price": "2.10", "time_in_force": "GTC",
           "image": "gpumarket/busybox:local", "command": ["sleep", "60"],
           "expires_at": in_a_day().replace(microsecond=0).isoformat(),
           "client_order_id": "same-everywhere.1", "interruptible": True,
           "ports": [8889, 8888, 22], "template": "pytorch-jupyter", "min_cuda": "12.2",
           "ssh": True, "env": {"WANDB_MODE": "offline"}}
    fast_buyer, slow_buyer = funded_buyer(100, ssh_key=True), funded_buyer(100, ssh_key=True)
    slow_client = client_for(slow_buyer)
    [fast] = asgi_post((token_of(fast_buyer), bid))
    slow = slow_client.post("/api/v1/orders/", bid, format="json")
    assert fast.status_code == slow.status_code == 201
    assert bid_batcher.batcher().stats["bids"] == 1
    assert without_ids(fast.json()) == without_ids(slow.json())
    assert fast.json()["ports"] == [22, 8888, 8889] and fast.json()["hours"] is None
    assert fast.json()["port_roles"] == {"22": "ssh", "8888": "jupyter"}
    assert fast.json()["status"] == "filled"
    assert len(fast.json()["leases"]) == len(slow.json()["leases"]) == 1
    stored = ["side", "status", "price", "gpus", "remaining_gpus", "duration_seconds",
              "gang_size", "time_in_force", "image", "command", "expires_at",
              "client_order_id", "interruptible", "ports", "market_id", "template",
              "min_cuda", "port_roles", "ssh", "env"]
    fast_order, slow_order = (Order.objects.values(*stored).get(pk=r.json()["id"])
                              for r in (fast, slow))
    assert fast_order == slow_order
    [fast_again] = asgi_post((token_of(fast_buyer), bid))
    slow_again = slow_client.post("/api/v1/orders/", bid, format="json")
    assert fast_again.status_code == slow_again.status_code == 200
    assert fast_again.json() == fast.json() and slow_again.json() == slow.json()
    assert bid_batcher.batcher().stats["bids"] == 2
    assert Order.objects.filter(side="bid").count() == 2
    assert first_violation() is None


def test_a_template_bid_no_node_can_run_rests_with_the_same_note_both_ways_in():
    provider, node, _ = registered_node()  # CUDA 12.2 (driver 535)
    client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "gpus": 4, "price": "2.00",
        "available_until": in_a_day().isoformat()}, format="json")
    bid = {**BID, "template": "cuda-ssh"}
    [fast] = asgi_post((token_of(funded_buyer(100, ssh_key=True)), bid))
    slow = client_for(funded_buyer(100, ssh_key=True)).post("/api/v1/orders/", bid, format="json")
    assert fast.status_code == slow.status_code == 201
    assert bid_batcher.batcher().stats["bids"] == 1
    assert without_ids(fast.json()) == without_ids(slow.json())
    assert fast.json()["match_note"] == "needs CUDA 12.4: 0 of 1 nodes with asks qualify"
    assert fast.json()["status"] == "open" and fast.json()["leases"] == []
