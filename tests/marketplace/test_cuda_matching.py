"""CUDA compatibility in the continuous auction (docs/MATCHING.md, "CUDA compatibility"):
a bid with a min_cuda fills only against asks on nodes whose CUDA version meets it, in
the engine (both directions, FOK) and through the book (fresh, cached and rebuilt books,
a node that re-registers with another driver); a bid no node can run rests and says why;
preemption never frees GPUs of an incompatible node for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from marketplace import auctions, engine, locking
from marketplace.env_templates import cuda_key, cuda_ok
from marketplace.errors import InvalidInput
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from marketplace.selectors import cuda_match_note
from providers import services as provider_services
from tests.factories import ask, bid, dump_gpus, funded_buyer, registered_node

NOW = 1_700_000_000
UNTIL = NOW + 86_400


def _ask(i, price, cuda, gpus=2):
    return engine.Ask(id=i, owner=100 + i, price=price, gpus=gpus, node=i,
                      available_until=UNTIL, seq=i, cuda=cuda)


def _bid(i, price, need=0, gpus=2, tif="GTC"):
    return engine.Bid(id=i, owner=200 + i, price=price, gpus=gpus, gang=gpus,
                      duration_s=3600, seq=i, tif=tif, min_cuda=need)


def test_versions_compare_as_tuples_and_an_unknown_node_qualifies_for_no_requirement():
    assert cuda_key("12.10") > cuda_key("12.9") > cuda_key("12.4") > cuda_key("11.8")
    assert cuda_ok("12.10", "12.9") and not cuda_ok("12.9", "12.10")
    assert cuda_ok("12.4.1", "12.4") and cuda_ok("13.0", "12.4")
    assert not cuda_ok("", "12.4") and not cuda_ok("n/a", "12.4")
    assert cuda_ok("", "") and cuda_key("") == 0


@given(st.one_of(st.just(""), st.text(max_size=8),
                 st.builds("{}.{}".format, st.integers(0, 999), st.integers(0, 999)),
                 st.builds("{}.{}.{}".format, st.integers(0, 999), st.integers(0, 999),
                           st.integers(0, 99))),
       st.builds("{}.{}".format, st.integers(1, 999), st.integers(0, 999)))
def test_the_engines_integers_decide_as_the_tuples_do(node_version, need):
    """What the engine compares (cuda_key) is what leases and sealed bids check (cuda_ok)."""
    assert cuda_ok(node_version, need) == (cuda_key(node_version) >= cuda_key(need))
    assert cuda_ok(node_version, "")


def test_engine_a_bid_skips_asks_below_its_cuda_and_fills_the_next_compatible_one():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000, cuda_key("12.2")))   # cheapest, too old
    ob.rest_ask(_ask(2, 1_500_000, 0))                    # reports no CUDA
    ob.rest_ask(_ask(3, 2_000_000, cuda_key("12.6")))
    r = ob.submit_bid(_bid(10, 3_000_000, cuda_key("12.4")), NOW)
    assert [(f.ask_id, f.price) for f in r.fills] == [(3, 2_000_000)]
    assert 1 in ob and 2 in ob  # the skipped asks stay
    # a bid with no requirement takes the cheapest, whatever its CUDA
    r = ob.submit_bid(_bid(11, 3_000_000), NOW)
    assert [f.ask_id for f in r.fills] == [1]


def test_engine_an_incoming_ask_skips_bids_its_node_cannot_run():
    ob = engine.OrderBook()
    ob.rest_bid(_bid(1, 3_000_000, cuda_key("12.4")))
    ob.rest_bid(_bid(2, 2_500_000))
    r = ob.submit_ask(_ask(10, 1_000_000, cuda_key("12.2")), NOW)
    assert [f.bid_id for f in r.fills] == [2] and 1 in ob
    r = ob.submit_ask(_ask(11, 1_000_000, cuda_key("12.4")), NOW)
    assert [f.bid_id for f in r.fills] == [1]


def test_engine_fok_is_killed_when_only_incompatible_asks_could_fill_it():
    ob = engine.OrderBook()
    ob.rest_ask(_ask(1, 1_000_000, cuda_key("12.2"), gpus=8))
    r = ob.submit_bid(_bid(10, 3_000_000, cuda_key("12.4"), tif="FOK"), NOW)
    assert r.killed and not r.fills and ob.asks()[0].gpus == 8


def _nodes(*cudas):
    """One provider's H100 node per CUDA version, each with 2 GPUs on offer at 2.00 (the
    first), 2.10, 2.20, …; returns the nodes."""
    provider = None
    nodes = []
    for i, cuda in enumerate(cudas):
        provider, node, _ = registered_node(name=f"cuda-{i}", user=provider, cuda_version=cuda,
                                            own_uuids=True)
        ask(provider, node, price=2_000_000 + i * 100_000, gpus=2)
        nodes.append(node)
    return nodes


@pytest.mark.django_db
def test_a_bid_fills_only_on_nodes_that_meet_its_min_cuda_and_the_lease_says_so():
    old, unknown, new = _nodes("12.2", "", "12.6")
    buyer = funded_buyer(100)
    placed = bid(buyer, price=3_000_000, gpus=4, gang_size=2, min_cuda="12.4")
    [lease] = placed.leases
    assert lease.node == new and lease.min_cuda == "12.4" and lease.price == 2_200_000
    order = placed.order
    assert order.status == "partially_filled" and order.remaining_gpus == 2
    # the 12.6 node's ask is filled: of the nodes still offering GPUs none qualifies
    assert cuda_match_note(order) == "needs CUDA 12.4: 0 of 2 nodes with asks qualify"
    # the other asks are untouched, and a bid with no requirement takes the cheapest
    [plain] = bid(funded_buyer(100), price=3_000_000, gpus=2).leases
    assert plain.node == old and plain.min_cuda == ""
    assert not Lease.objects.filter(node=unknown).exists()


@pytest.mark.django_db
def test_a_bid_no_node_can_run_rests_and_says_why_then_a_new_node_fills_it():
    _nodes("12.2", "12.2")
    buyer = funded_buyer(100)
    placed = bid(buyer, price=3_000_000, gpus=2, min_cuda="12.4")
    assert placed.leases == [] and placed.order.status == "open"
    assert cuda_match_note(placed.order) == "needs CUDA 12.4: 0 of 2 nodes with asks qualify"
    provider, node, _ = registered_node(name="fresh", cuda_version="12.4", own_uuids=True)
    [lease] = ask(provider, node, price=2_900_000, gpus=2).leases
    assert lease.fill.bid_id == placed.order.pk and lease.price == 3_000_000
    placed.order.refresh_from_db()
    assert placed.order.status == "filled" and cuda_match_note(placed.order) is None


@pytest.mark.django_db(transaction=True)
def test_cached_books_follow_a_node_that_registers_again_with_another_driver():
    """The book cache holds each ask's node CUDA version: a runner that registers again
    with an older driver must not leave a cached book matching against the old one (the
    lease would be refused by create_lease's guard; docs/MATCHING.md)."""
    locking.book_cache.clear()
    [node] = _nodes("12.6")
    bid(funded_buyer(100), price=1_000_000, gpus=2)  # a write that caches the book
    assert locking.book_cache.peek(node.asks.get().market_id) is not None
    provider_services.inventory_record(node=node, hostname=node.name, driver_version="535",
                                       cuda_version="12.2", runner_version="test",
                                       source="simulate", gpus=dump_gpus(name=node.name))
    placed = bid(funded_buyer(100), price=3_000_000, gpus=2, min_cuda="12.4")
    assert placed.leases == [] and placed.order.status == "open"
    assert cuda_match_note(placed.order) == "needs CUDA 12.4: 0 of 1 nodes with asks qualify"


@pytest.mark.django_db
def test_a_resting_bid_fills_as_soon_as_its_node_registers_with_a_newer_driver(
        django_capture_on_commit_callbacks):
    [node] = _nodes("12.2")
    placed = bid(funded_buyer(100), price=3_000_000, gpus=2, min_cuda="12.4")
    assert placed.leases == []
    with django_capture_on_commit_callbacks(execute=True):
        provider_services.inventory_record(
            node=node, hostname=node.name, driver_version="560.35.03", cuda_version="12.6",
            runner_version="test", source="simulate", gpus=dump_gpus(name=node.name))
    lease = Lease.objects.get()
    assert lease.fill.bid_id == placed.order.pk and lease.node == node
    assert lease.price == 2_000_000  # the ask stood first: its price
    placed.order.refresh_from_db()
    assert placed.order.status == "filled"


@pytest.mark.django_db
def test_a_min_cuda_bid_preempts_no_lease_on_a_node_it_cannot_run_on():
    [node] = _nodes("12.2")
    [victim] = bid(funded_buyer(100), price=2_100_000, gpus=2, interruptible=True).leases
    mark_running(lease=victim, container_id="v" * 64)
    high = bid(funded_buyer(100), price=4_000_000, gpus=2, min_cuda="12.4")
    victim.refresh_from_db()
    assert high.order.status == "open" and victim.preempt_at is None
    # the same bid without the requirement would preempt it
    bid(funded_buyer(100), price=4_000_000, gpus=2)
    victim.refresh_from_db()
    assert victim.preempt_at is not None
    assert node.asks.get().status == "filled"


@pytest.mark.django_db
def test_book_refuses_a_malformed_min_cuda_or_port_roles_writing_nothing():
    _nodes("12.6")
    buyer = funded_buyer(100)
    for terms, field in (({"min_cuda": "12"}, "min_cuda"),
                         ({"min_cuda": "12.04"}, "min_cuda"),
                         ({"port_roles": {"22": "ssh"}}, "port_roles"),
                         ({"ports": [22], "port_roles": {"22": "shell"}}, "port_roles"),
                         ({"env": {"lower": "x"}}, "env")):
        with pytest.raises(InvalidInput) as err:
            bid(buyer, price=3_000_000, gpus=2, **terms)
        assert err.value.field == field
    assert not Order.objects.filter(side="bid").exists()


@pytest.mark.django_db
def test_a_sealed_bid_from_python_is_held_to_the_same_shapes():
    provider, node, _ = registered_node(cuda_version="12.6")
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    buyer = funded_buyer(100)
    for terms, field in (({"min_cuda": "12.04"}, "min_cuda"),
                         ({"port_roles": {"8888": "jupyter"}}, "port_roles"),
                         ({"env": {"GPUMARKET_LEASE_ID": "1"}}, "env.GPUMARKET_LEASE_ID")):
        with pytest.raises(InvalidInput) as err:
            auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk,
                                      price=1_500_000, **terms)
        assert err.value.field == field
    assert not auction.bids.exists()
