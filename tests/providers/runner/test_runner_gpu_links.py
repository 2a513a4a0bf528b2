"""The inventory's NVLink peers and PCIe link per GPU (gpu_links), from recorded hosts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from providers.models import Gpu
from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.gpu_links import nvlink_peers, topology_fields
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import GpuInfo, NvLinkInfo
from providers.services import node_create, provider_onboard
from tests.factories import UserFactory, ensure_catalog
from tests.support.nvlink_hosts import h100_host
from tests.support.servers import AsgiServer

from .runner_helpers import TOKEN
from .test_runner_cli import runner

BUSES = [f"00000000:{b}:00.0" for b in ("53", "64", "75", "86", "97", "A8", "B9", "CA")]


def test_an_nvswitch_board_is_a_full_mesh_and_bridges_give_pairs(tmp_path):
    mesh = DumpGpus(h100_host(tmp_path, "nvswitch")).inventory().gpus
    peers = nvlink_peers(mesh)
    assert [peers[g.uuid] for g in mesh] == [[b for b in BUSES if b != g.pci_bus_id]
                                             for g in mesh]
    pairs = DumpGpus(h100_host(tmp_path, "pairs")).inventory().gpus
    assert [nvlink_peers(pairs)[g.uuid] for g in pairs] == [[BUSES[n ^ 1]] for n in range(8)]
    assert nvlink_peers(DumpGpus(h100_host(tmp_path, "pcie")).inventory().gpus) == {}


def test_links_down_or_without_a_remote_name_no_peer():
    def gpu(n, links):
        return GpuInfo(f"GPU-{n:08x}-0000", "NVIDIA H100 80GB HBM3", 81559, BUSES[n], "Disabled",
                       "h100-sxm-80gb", nvlinks=tuple(links))
    gpus = [gpu(0, [NvLinkInfo(0, False, BUSES[1]), NvLinkInfo(1, True, None)]),
            gpu(1, [NvLinkInfo(0, True, BUSES[0])])]
    fields = topology_fields(gpus, {gpus[0].uuid: {"pcie_gen_max": 5, "pcie_width_max": 16,
                                                   "uuid": gpus[0].uuid}})
    assert fields[gpus[0].uuid] == {"nvlink": {"links_active": 1, "peers": []},
                                    "pcie_generation": 5, "pcie_width": 16}
    assert fields[gpus[1].uuid] == {"nvlink": {"links_active": 1, "peers": [BUSES[0]]}}


def test_announce_sends_nvlink_and_the_pcie_link_of_each_gpu(tmp_path, marketplace,
                                                            monkeypatch):
    route = marketplace.route

    def with_warning(method, path, body):
        status, answer = route(method, path, body)
        return status, {**answer, "warnings": ["gpus[0].nvlink.peers[0]: … ignored"]}

    monkeypatch.setattr(marketplace, "route", with_warning)
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    lines: list[str] = []
    try:
        Agent(client, DumpGpus(h100_host(tmp_path, "nvswitch")),
              runtime=SimpleNamespace(node=None), log=lines.append).announce()
    finally:
        client.close()
    assert lines == ["the marketplace ignored part of the inventory: "
                     "gpus[0].nvlink.peers[0]: … ignored"]
    first = marketplace.inventories[0]["gpus"][0]
    assert first["nvlink"] == {"links_active": 18, "peers": BUSES[1:]}
    assert (first["pcie_generation"], first["pcie_width"]) == (5, 16)


@pytest.mark.django_db(transaction=True)
def test_register_stores_the_topology_on_the_real_server(tmp_path):
    """`gpumarket-runner register --simulate` (a process) → the real inventory endpoint →
    the node's GPUs know their NVLink peers and PCIe link."""
    ensure_catalog()
    provider = provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    created = node_create(provider=provider, name="mesh")
    with AsgiServer() as server:
        done = runner("register", "--url", server.url, "--simulate",
                      str(h100_host(tmp_path, "nvswitch")), "--state-dir", str(tmp_path / "s"),
                      env={"GPUMARKET_RUNNER_TOKEN": created.runner_token})
    assert done.returncode == 0, done.stderr
    gpus = list(Gpu.objects.filter(node=created.node).order_by("pci_bus_id"))
    assert [g.nvlink_peers for g in gpus] == [[b for b in BUSES if b != g.pci_bus_id]
                                              for g in gpus]
    assert {(g.nvlink_links_active, g.pcie_generation, g.pcie_width) for g in gpus} == {
        (18, 5, 16)}
