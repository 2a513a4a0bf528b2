"""Recorded hosts listed, traded and run end to end (issue 13), with real parts:
PostgreSQL, the live HTTP server, the runner as its own process (`register` and `run
--simulate <recording>`), and real Docker containers (--simulate: no GPU reaches them).

A MIG-partitioned host (the recorded H100 and H200 with their `-L`; the A100's `-q -x`
with a made `-L`, tests/support/mig_host.py) registers its slices (never the GPU whole)
→ an ask and a bid for 2 slices of one profile trade → the lease's container sees
exactly those MIG UUIDs (NVIDIA_VISIBLE_DEVICES, checked from inside by the runner) →
the lease ends, the container is gone, 85 % / 15 %, the hold released, the ledger clean.
The recorded H200 (whole) goes the same way in test_lease_flow.py.
"""

from __future__ import annotations

import pytest

from providers.models import Gpu
from providers.runner.nvsmi import parse_dump
from tests.support.mig_host import A100_MIG, H100_MIG_DUMP, with_a100_listing
from tests.support.trading import empty_node, trade_and_settle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

H200_MIG_DUMP = H100_MIG_DUMP.with_name("h200-mig-x1.utku-exporter-590.48.01.q-idle.txt")


@pytest.mark.parametrize(("dump", "product", "layout", "market"), [
    pytest.param(H100_MIG_DUMP, "NVIDIA H100 80GB HBM3 (h100-sxm-80gb)",
                 "3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb", "h100-sxm-80gb.1g.10gb", id="h100"),
    pytest.param(H200_MIG_DUMP, "NVIDIA H200 (h200-sxm-141gb)",
                 # GPU instance 2 is split into two compute instances: not offered
                 "2g.35gb, 1g.18gb, 1g.18gb", "h200-sxm-141gb.1g.18gb", id="h200"),
])
def test_recorded_mig_host_registers_its_slices_trades_two_and_runs_on_them(
        live_server, docker_client, test_image, runner_factory, dump, product, layout, market):
    provider, node, token = empty_node("mig-host")
    runner = runner_factory(live_server.url, token, dump)
    reg = runner.register()
    assert reg.returncode == 0, reg.stderr
    [gpu] = parse_dump(dump).gpus
    assert f"1 \u00d7 {product}" in reg.stdout
    # the recording's UUIDs are zeroed: the runner replaced them (runner/sim_uuids.py)
    assert "has zeroed UUIDs" in reg.stdout and gpu.uuid not in reg.stdout.split("note:")[0]
    assert f"offered as {len(layout.split(', '))} MIG slices of GPU-" in reg.stdout
    assert f": {layout}" in reg.stdout, reg.stdout
    slices = {g.uuid: g.mig_profile for g in node.gpus.all()}
    assert sorted(slices.values()) == sorted(layout.split(", "))
    [parent] = {g.parent for g in node.gpus.all()}
    assert not Gpu.every.get(pk=parent.pk).listed  # never offered whole
    runner.start()

    leased = trade_and_settle(provider=provider, node=node, runner=runner,
                              docker_client=docker_client, test_image=test_image,
                              market=market, gpus=2, price=400_000)
    profile = market.split(".", 1)[1]
    assert leased == sorted(u for u, p in slices.items() if p == profile)


def test_recorded_mig_a100_xml_with_a_listing_registers_and_runs_its_slices(
        live_server, docker_client, test_image, runner_factory, tmp_path):
    provider, node, token = empty_node("mig-a100")
    (tmp_path / "host").mkdir()
    runner = runner_factory(live_server.url, token, with_a100_listing(tmp_path / "host"))
    reg = runner.register()
    assert reg.returncode == 0, reg.stderr
    assert "NVIDIA A100-SXM4-80GB (a100-sxm-80gb)" in reg.stdout
    assert "offered as 4 MIG slices of GPU-513536b6-7d19-9063-b049-1e69664bb298" in reg.stdout
    [gpu] = A100_MIG.gpus
    assert {g.uuid: g.mig_profile for g in node.gpus.all()} == {
        d.uuid: "1g.20gb" for d in gpu.mig_devices}
    assert not Gpu.every.get(uuid=gpu.uuid).listed
    runner.start()

    leased = trade_and_settle(provider=provider, node=node, runner=runner,
                              docker_client=docker_client, test_image=test_image,
                              market="a100-sxm-80gb.1g.20gb", gpus=2, price=300_000)
    assert len(leased) == 2 and set(leased) <= {d.uuid for d in gpu.mig_devices}
