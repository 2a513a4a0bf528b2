"""`gpumarket-runner register --simulate` of the trial's MIG and scrubbed recordings (a
process) against the real server: what each registers, offers and says."""

from __future__ import annotations

import pytest

from providers.models import Gpu
from providers.services import node_create, provider_onboard
from tests.conftest import DATA
from tests.factories import UserFactory, ensure_catalog
from tests.support.servers import AsgiServer

from .test_runner_cli import runner

DUMPS = DATA / "nvidia-smi"
H200_MIG = DUMPS / "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt"
A100_MIG = DUMPS / "a100-sxm4-80gb-mig-x1of4.telegraf.xml"
H200 = DUMPS / "h200-x1.utku-exporter-590.48.01.q-idle.txt"
H100_MIG = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"

pytestmark = pytest.mark.django_db(transaction=True)


def _node(name: str):
    ensure_catalog()
    provider = provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    return node_create(provider=provider, name=name)


def _register(server, created, dump, state):
    return runner("register", "--url", server.url, "--simulate", str(dump), "--state-dir",
                  str(state), env={"GPUMARKET_RUNNER_TOKEN": created.runner_token})


def test_the_h200_mig_recording_registers_without_its_split_gpu_instance(tmp_path):
    """GPU instance 2 holds two compute instances (1c.3g.71gb, 2c.3g.71gb): not offered,
    said so; the GPU's other three slices register (before: 400, memory counted twice)."""
    created = _node("h200mig")
    with AsgiServer() as server:
        done = _register(server, created, H200_MIG, tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert "GPU instance 2 (3g.71gb) is split into 2 compute instances (1c.3g.71gb, " \
           "2c.3g.71gb): not offered" in done.stdout
    slices = sorted(Gpu.objects.filter(node=created.node)
                    .values_list("mig_profile", "gpu_instance_id"))
    assert slices == [("1g.18gb", 9), ("1g.18gb", 10), ("2g.35gb", 3)]
    [parent] = Gpu.every.filter(node=created.node, parent=None)
    assert not parent.listed and parent.product_name == "NVIDIA H200"


def test_a_mig_enabled_gpu_without_mig_devices_is_registered_not_offered(tmp_path):
    created = _node("a100mig")
    with AsgiServer() as server:
        done = _register(server, created, A100_MIG, tmp_path / "s")
    assert done.returncode == 0, done.stderr
    assert "is MIG-enabled with no usable MIG device: registered, not offered" in done.stdout
    assert not Gpu.objects.filter(node=created.node).exists()  # nothing listed
    assert Gpu.every.get(node=created.node).mig_mode == "Enabled"


def test_scrubbed_recordings_register_on_two_nodes_with_stable_own_uuids(tmp_path):
    """Three recordings share GPU-00000000-…: each state dir gets its own UUIDs (before:
    the second node's register was a 409), the same ones on every register."""
    first, second, third = _node("a"), _node("b"), _node("c")
    with AsgiServer() as server:
        for created, dump, state in ((first, H200, "a"), (second, H200, "b"),
                                     (third, H100_MIG, "c")):
            done = _register(server, created, dump, tmp_path / state)
            assert done.returncode == 0, done.stderr
            assert "has zeroed UUIDs (a scrubbed recording)" in done.stdout
        uuids = {c.node.pk: set(Gpu.every.filter(node=c.node).values_list("uuid", flat=True))
                 for c in (first, second, third)}
        again = _register(server, first, H200, tmp_path / "a")
    assert again.returncode == 0, again.stderr
    assert set(Gpu.every.filter(node=first.node).values_list("uuid", flat=True)) \
        == uuids[first.node.pk]
    every = [u for found in uuids.values() for u in found]
    assert len(every) == len(set(every)) and not any(u.endswith("0000-000000000000")
                                                     for u in every)
