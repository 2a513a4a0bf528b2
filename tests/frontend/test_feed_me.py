"""/ws/me/: authenticated by session or a single-use ?ticket=; the user's own orders, sealed bids,
leases and balance changes — never another user's."""

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.utils import timezone

from marketplace import api_tokens, auctions, book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running
from tests.factories import ensure_catalog, funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
H100 = "h100-sxm-80gb"


def _token_path(user) -> str:
    """A /ws/me/ path with a new single-use ticket of `user` (one connection)."""
    ticket, _ = api_tokens.issue_ticket(user=user)
    return f"/ws/me/?ticket={ticket}"


def test_anonymous_is_refused_with_4401():
    async def scenario():
        results = []
        for path in ("/ws/me/", "/ws/me/?ticket=not-a-ticket"):
            _, connected, code = await connect(path)
            results.append((connected, code))
        return results

    assert async_to_sync(scenario)() == [(False, 4401), (False, 4401)]


def test_session_cookie_authenticates():
    buyer = funded_buyer(5)
    buyer.refresh_from_db()  # the factory's set_password is not saved: use the stored hash
    client = Client()
    client.force_login(buyer)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def scenario():
        comm, connected, detail = await connect("/ws/me/", (b"cookie", cookie))
        assert connected, detail
        snap = await recv(comm)
        await comm.disconnect()
        return snap

    snap = async_to_sync(scenario)()
    assert snap["type"] == "snapshot" and snap["feed"] == "me" and snap["user"] == buyer.pk
    assert snap["wallet"] == {"available": "5.000000", "held": "0.000000",
                              "earned": "0.000000"}


def test_own_orders_leases_and_balance_only_never_another_users():
    provider, node, _ = registered_node()
    alice, bob = funded_buyer(100), funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=6, available_until=in_a_day())
    paths = {u: _token_path(u) for u in (alice, bob, provider)}

    def alice_trades_and_her_lease_ends():
        placed = book.place_bid(buyer_id=alice.pk, market_slug=H100, price=2_600_000, gpus=2,
                                duration_seconds=3600)
        [lease] = placed.leases
        mark_running(lease=lease, container_id="c" * 64,
                     now=timezone.now() - timedelta(seconds=1800))
        end_lease(lease_id=lease.pk, status="completed", cause="test")
        return placed.order.pk, lease.pk

    async def scenario():
        comms = {}
        for user, path in paths.items():
            comm, connected, _ = await connect(path)
            assert connected
            assert (await recv(comm))["user"] == user.pk
            comms[user] = comm
        order_id, lease_id = await call(alice_trades_and_her_lease_ends)
        # bob's resting bid and sealed bid: only bob hears of them
        bob_order = await call(book.place_bid, buyer_id=bob.pk, market_slug=H100,
                               price=1_000_000, gpus=1, duration_seconds=3600)
        auction = await call(auctions.open_auction, provider_id=provider.pk, node_id=node.pk,
                             gpus=2, reserve_price=2_000_000, duration_seconds=3600,
                             closes_at=timezone.now() + timedelta(hours=1))
        bob_bid = await call(auctions.place_sealed_bid, bidder_id=bob.pk,
                             auction_id=auction.pk, price=3_333_333)
        frames = {user: await drain(comm, timeout=0.8) for user, comm in comms.items()}
        for comm in comms.values():
            await comm.disconnect()
        return order_id, lease_id, bob_order.order.pk, bob_bid.pk, frames

    order_id, lease_id, bob_order_id, bob_bid_id, frames = async_to_sync(scenario)()
    mine = {u: [json.loads(f) for f in fs] for u, fs in frames.items()}

    # alice: her order, her lease (pending → running → completed), her balance
    a = mine[alice]
    assert {m["order"]["id"] for m in a if m["type"] == "order"} == {order_id}
    leases = [m["lease"] for m in a if m["type"] == "lease"]
    assert {le["id"] for le in leases} == {lease_id}
    assert {le["role"] for le in leases} == {"buyer"}
    assert [le["status"] for le in leases][-1] == "completed"
    assert leases[-1]["cost"] == "2.490000"  # 2 GPUs × 2.49 × 1800 s / 3600
    balances = [m for m in a if m["type"] == "balance"]
    assert balances and balances[-1]["wallet"]["held"] == "0.000000"
    assert balances[-1]["wallet"]["available"] == "97.510000"
    assert not any(m["type"] == "sealed_bid" for m in a)
    seqs = [m["seq"] for m in a]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, no gap
    # the provider: its ask and the lease, as provider, and its earnings
    p = mine[provider]
    assert {le["lease"]["role"] for le in p if le["type"] == "lease"} == {"provider"}
    assert [m for m in p if m["type"] == "balance"][-1]["wallet"]["earned"] == "2.116500"
    # bob: his own order and sealed bid (with its price: it is his), nothing of alice's
    b = mine[bob]
    assert {m["order"]["id"] for m in b if m["type"] == "order"} == {bob_order_id}
    assert [m["bid"]["price"] for m in b if m["type"] == "sealed_bid"] == ["3.333333"]
    assert not any(m["type"] == "lease" for m in b)
    assert {m["bid"]["id"] for m in b if m["type"] == "sealed_bid"} == {bob_bid_id}
    # nobody but bob ever sees his sealed bid's price, or his order (ids of different
    # tables may coincide, so orders are compared as orders)
    for user in (alice, provider):
        for raw in frames[user]:
            assert "3.333333" not in raw and "3333333" not in raw
        assert bob_order_id not in {m["order"]["id"] for m in mine[user]
                                    if m["type"] == "order"}


def test_order_and_balance_messages_only_for_users_someone_listens_to():
    """The publisher asks which users have a /ws/me/ subscriber (after commit, before
    reading) and reads and sends order and balance messages for those only; a user who
    connects later finds the change in the snapshot instead."""
    from frontend import feed

    ensure_catalog()
    alice, bob = funded_buyer(100), funded_buyer(100)
    alice_path, bob_path = _token_path(alice), _token_path(bob)

    async def scenario():
        comm, connected, _ = await connect(alice_path)
        assert connected
        await recv(comm)
        listening = await call(feed.counter().listening_users)
        among = await call(feed.counter().listening_among, {alice.pk, 10**12})
        await call(book.place_bid, buyer_id=alice.pk, market_slug=H100, price=1_000_000,
                   gpus=1, duration_seconds=3600)
        bob_order = await call(book.place_bid, buyer_id=bob.pk, market_slug=H100,
                               price=1_100_000, gpus=1, duration_seconds=3600)
        heard = await drain(comm, timeout=0.8)
        await comm.disconnect()
        late, connected, _ = await connect(bob_path)
        snap = await recv(late)
        await late.disconnect()
        return listening, among, heard, bob_order.order.pk, snap

    listening, among, heard, bob_order_id, snap = async_to_sync(scenario)()
    # (pub/sub channels span Redis databases: another test run's subscriber may share
    # bob's id, so only alice's presence is certain here; messages() is checked below)
    assert alice.pk in listening
    # asked for the users concerned only (PUBSUB NUMSUB): nobody has user id 10**12
    assert among == {alice.pk}
    kinds = [json.loads(f)["type"] for f in heard]
    assert "order" in kinds and "balance" in kinds
    assert bob_order_id in {o["id"] for o in snap["orders"]}
    assert snap["wallet"]["held"] == "1.100000"

    # what the publisher reads: for nobody listening, no order or posting row at all
    batch = feed.Batch(orders={bob_order_id}, entries=set())
    assert batch.messages(listening=set()) == []
    assert [g for g, *_ in batch.messages(listening={bob.pk})] == [feed.user_group(bob.pk)]
    # the publisher's form: a function asked with exactly the users concerned
    asked = []
    assert batch.messages(listening=lambda users: asked.append(users) or set()) == []
    assert asked == [{bob.pk}]
    assert [g for g, *_ in batch.messages(listening=lambda users: users)] \
        == [feed.user_group(bob.pk)]
    # a batch without user rows never asks
    assert feed.Batch().messages(listening=lambda users: 1 / 0) == []
