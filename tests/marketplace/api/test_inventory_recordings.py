"""Every recorded real host (data/nvidia-smi/) registers through POST /api/v1/runner/inventory/
with the product names its GPUs report (the runner's --simulate path, the real server):
its units as the runner sends them (MIG slices: runner/mig.py), scrubbed UUIDs replaced
(runner/sim_uuids.py)."""

from __future__ import annotations

import pytest

from providers import services as provider_services
from providers.models import Gpu
from providers.runner import mig
from providers.runner.nvml import DumpGpus
from tests.conftest import DATA
from tests.factories import UserFactory, ensure_catalog
from tests.providers.runner.test_runner_recordings import RECORDINGS
from tests.support.api import runner_client

pytestmark = pytest.mark.django_db

DUMPS = DATA / "nvidia-smi"


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_every_recording_registers_with_its_real_model_names(name):
    ensure_catalog()
    provider = provider_services.provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    created = provider_services.node_create(provider=provider, name="rec-1")
    inv = DumpGpus(DUMPS / name, uuid_salt="rec-1").inventory()
    body = {"hostname": "rec-1", "driver_version": inv.driver_version,
            "cuda_version": inv.cuda_version, "runner_version": "test", "source": inv.source,
            "gpus": mig.inventory_items(inv)}
    r = runner_client(created.runner_token).post("/api/v1/runner/inventory/", body,
                                                 format="json")
    assert r.status_code == 200, r.content
    names = set(Gpu.every.filter(node=created.node).values_list("product_name", flat=True))
    assert names == {RECORDINGS[name][1]}
    assert not any(u.strip("GPUMI-0") == "" for u in
                   Gpu.every.filter(node=created.node).values_list("uuid", flat=True))
