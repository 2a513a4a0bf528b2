"""NVLink bids (interconnect "nvlink"): matching fills them only on a node with a free
NVLink-connected gang, and the lease takes such a gang (continuous and sealed)."""

from __future__ import annotations

from datetime import timedelta
from itertools import combinations

import pytest
from django.utils import timezone

from marketplace import auctions, book, interconnect, locking
from marketplace.errors import InvalidInput
from marketplace.models import Lease, SealedBid
from providers.models import Gpu
from tests.factories import ask, bid, funded_buyer, registered_node
from tests.support.api import snapshot
from tests.support.nvlink_hosts import h100_host

pytestmark = pytest.mark.django_db
H100 = "h100-sxm-80gb"


def lease_gpus(lease: Lease) -> list[Gpu]:
    return [x.gpu for x in lease.lease_gpus.select_related("gpu")]


def connected(gpus: list[Gpu]) -> bool:
    return all(b.pci_bus_id in a.nvlink_peers and a.pci_bus_id in b.nvlink_peers
               for a, b in combinations(gpus, 2))


@pytest.fixture
def nodes(tmp_path):
    """A full-mesh H100 x8 (NVSwitch) and a PCIe-only one of another provider."""
    mesh = registered_node(h100_host(tmp_path, "nvswitch", "a1"), "mesh")
    pcie = registered_node(h100_host(tmp_path, "pcie", "b2"), "pcie")
    return mesh, pcie


def test_the_inventory_stores_each_gpus_peers(nodes):
    (_p, mesh, _t), (_q, pcie, _u) = nodes
    gpus = list(mesh.gpus.order_by("pci_bus_id"))
    assert [g.nvlink_links_active for g in gpus] == [18] * 8
    assert connected(gpus)
    assert [(g.nvlink_links_active, g.nvlink_peers) for g in pcie.gpus.all()] == [(None, [])] * 8


def test_an_nvlink_bid_for_4_fills_only_on_the_mesh_node(nodes):
    (mesh_owner, mesh, _t), (pcie_owner, pcie, _u) = nodes
    ask(pcie_owner, pcie, price=1_000_000, gpus=8)  # cheaper, but PCIe only
    ask(mesh_owner, mesh, price=2_000_000, gpus=8)
    buyer = funded_buyer(1000)
    placed = bid(buyer, price=3_000_000, gpus=4, gang_size=4, interconnect="nvlink")
    [lease] = placed.leases
    assert lease.node_id == mesh.pk and placed.order.status == "filled"
    assert len(lease_gpus(lease)) == 4 and connected(lease_gpus(lease))
    # a bid without the requirement takes the cheaper PCIe node as before
    [plain] = bid(buyer, price=3_000_000, gpus=4, gang_size=4).leases
    assert plain.node_id == pcie.pk


def test_an_nvlink_bid_rests_until_a_connected_gang_is_offered(nodes, tmp_path):
    (mesh_owner, mesh, _t), (pcie_owner, pcie, _u) = nodes
    ask(pcie_owner, pcie, price=1_000_000, gpus=8)
    buyer = funded_buyer(1000)
    placed = bid(buyer, price=3_000_000, gpus=8, gang_size=2, interconnect="nvlink")
    assert placed.leases == [] and placed.order.status == "open"
    pairs_owner, pairs, _ = registered_node(h100_host(tmp_path, "pairs", "c3"), "pairs")
    leases = ask(pairs_owner, pairs, price=2_000_000, gpus=8).leases
    [lease] = leases
    chosen = sorted(lease_gpus(lease), key=lambda g: g.pci_bus_id)
    assert lease.gpu_count == 8 and all(connected(chosen[n:n + 2]) for n in (0, 2, 4, 6))
    # on a node of pairs no gang of 4 is connected: an NVLink bid for 4 waits
    ask(mesh_owner, mesh, price=2_500_000, gpus=4)
    [on_mesh] = bid(buyer, price=3_000_000, gpus=4, gang_size=4, interconnect="nvlink").leases
    assert on_mesh.node_id == mesh.pk and connected(lease_gpus(on_mesh))


def test_a_gpu_whose_links_are_down_is_left_out_of_an_nvlink_gang(nodes):
    (mesh_owner, mesh, _t), _ = nodes
    gpus = list(mesh.gpus.order_by("pci_bus_id"))
    Gpu.objects.filter(pk=gpus[0].pk).update(nvlink_peers=[])  # the others still name it
    Gpu.objects.filter(pk=gpus[4].pk).update(healthy=False)
    ask(mesh_owner, mesh, price=2_000_000, gpus=5)
    buyer = funded_buyer(1000)
    [lease] = bid(buyer, price=3_000_000, gpus=4, gang_size=4, interconnect="nvlink").leases
    assert {g.pk for g in lease_gpus(lease)} == {g.pk for g in gpus[1:4] + gpus[5:6]}
    [plain] = bid(buyer, price=3_000_000, gpus=1).leases  # no requirement: bus-id order
    assert [g.pk for g in lease_gpus(plain)] == [gpus[0].pk]


def test_interconnect_is_refused_on_a_gang_of_one_and_for_unknown_words(nodes):
    buyer = funded_buyer(1000)
    before = snapshot(buyer)
    for terms, words in (({"gpus": 1}, "gang of 2"), ({"gpus": 4, "gang_size": 1}, "gang of 2"),
                         ({"gpus": 2, "interconnect": "infiniband"}, "any or nvlink")):
        with pytest.raises(InvalidInput, match=words) as caught:
            bid(buyer, **{"interconnect": "nvlink", **terms})
        assert caught.value.field == "interconnect"
    assert snapshot(buyer) == before


def test_a_sealed_nvlink_bid_wins_connected_gpus_and_is_refused_where_none_are(nodes):
    (mesh_owner, mesh, _t), (pcie_owner, pcie, _u) = nodes
    now = timezone.now()
    closes = now + timedelta(minutes=5)
    lot = auctions.open_auction(provider_id=mesh_owner.pk, node_id=mesh.pk, gpus=4,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=closes, rule="uniform_price", now=now)
    flat = auctions.open_auction(provider_id=pcie_owner.pk, node_id=pcie.pk, gpus=4,
                                 reserve_price=1_000_000, duration_seconds=3600,
                                 closes_at=closes, now=now)
    buyer = funded_buyer(1000)
    before = snapshot(buyer)
    for auction, gpus, words in ((flat, 4, "no 4 GPUs all NVLink-connected"),
                                 (lot, 1, "gang of 2")):
        with pytest.raises(InvalidInput, match=words) as caught:
            auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=auction.pk, gpus=gpus,
                                      price=2_000_000, interconnect="nvlink", now=now)
        assert caught.value.field == "interconnect"
    assert snapshot(buyer) == before
    sealed = auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=lot.pk, gpus=4,
                                       price=2_000_000, interconnect="nvlink", now=now)
    auctions.close_auction(auction_id=lot.pk, now=closes)
    sealed.refresh_from_db()
    assert sealed.status == SealedBid.Status.WON
    lease = Lease.objects.get(sealed_bid=sealed)
    assert len(lease_gpus(lease)) == 4 and connected(lease_gpus(lease))


def test_a_sealed_nvlink_award_the_node_cannot_connect_any_more_loses(nodes):
    (mesh_owner, mesh, _t), _ = nodes
    now = timezone.now()
    closes = now + timedelta(minutes=5)
    lot = auctions.open_auction(provider_id=mesh_owner.pk, node_id=mesh.pk, gpus=8,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=closes, now=now)
    buyer = funded_buyer(1000)
    sealed = auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=lot.pk, gpus=8,
                                       price=2_000_000, interconnect="nvlink", now=now)
    Gpu.objects.filter(node=mesh, pci_bus_id="00000000:53:00.0").update(nvlink_peers=[])
    auctions.close_auction(auction_id=lot.pk, now=closes)
    sealed.refresh_from_db()
    assert sealed.status == SealedBid.Status.LOST
    assert not Lease.objects.filter(sealed_bid=sealed).exists()
    assert book.free_gpu_count(mesh, lot.market) == 8


@pytest.mark.django_db(transaction=True)
def test_a_cached_book_asks_the_topology_as_it_is_now(tmp_path, monkeypatch):
    monkeypatch.setattr(locking, "book_cache", locking.BookCache())
    owner, mesh, _t = registered_node(h100_host(tmp_path, "nvswitch", "9f"), "mesh")
    buyer = funded_buyer(1000)
    waiting = bid(buyer, price=3_000_000, gpus=4, gang_size=4, interconnect="nvlink").order
    Gpu.objects.filter(node=mesh, pci_bus_id="00000000:53:00.0").update(nvlink_peers=[])
    hits = locking.book_cache.stats["hit"]
    [lease] = ask(owner, mesh, price=2_000_000, gpus=8).leases
    assert locking.book_cache.stats["hit"] == hits + 1  # the resting bid came from the cache
    assert lease.fill.bid_id == waiting.pk and connected(lease_gpus(lease))
    assert "00000000:53:00.0" not in {g.pci_bus_id for g in lease_gpus(lease)}


def test_links_without_known_peers_are_worded_so_and_never_fill_an_nvlink_bid(nodes):
    (mesh_owner, mesh, _t), _ = nodes
    mesh.gpus.update(nvlink_peers=[])  # as from `nvidia-smi nvlink -s`: links, no remotes
    name = mesh.gpus.first().gpu_class.name
    assert interconnect.node_summary(mesh.pk, mesh.gpus.first().gpu_class_id) == (
        f"8 \u00d7 {name}, NVLink, peers unknown")
    ask(mesh_owner, mesh, price=2_000_000, gpus=8)
    placed = bid(funded_buyer(100), price=3_000_000, gpus=2, interconnect="nvlink")
    assert placed.leases == [] and placed.order.status == "open"
