"""POST /api/v1/runner/inventory/ refuses what no real host reports: a CUDA its driver
cannot support, the all-zero UUID; a MIG-enabled GPU sent whole is kept, never offered."""

from __future__ import annotations

import pytest

from providers import cuda_driver
from providers.models import Gpu
from providers.services import node_create, provider_onboard
from tests.factories import UserFactory, ensure_catalog
from tests.support.api import assert_refused, runner_client
from tests.support.mig_host import A100_MIG

pytestmark = pytest.mark.django_db


def _post(token, *, driver="535.183.01", cuda="12.2", gpus=None):
    body = {"hostname": "h", "driver_version": driver, "cuda_version": cuda,
            "runner_version": "t", "source": "test",
            "gpus": gpus or [{"uuid": "GPU-3e9b8a54-2b6e-4d0f-9a1c-5f7e2d8c0b11",
                              "product_name": "NVIDIA H100 80GB HBM3",
                              "gpu_class": "h100-sxm-80gb", "memory_mib": 81559,
                              "pci_bus_id": "00000000:53:00.0", "mig_mode": "Disabled"}]}
    return runner_client(token).post("/api/v1/runner/inventory/", body, format="json")


def _node():
    ensure_catalog()
    provider = provider_onboard(user_id=UserFactory().pk, display_name="Acme")
    return node_create(provider=provider, name="n")


@pytest.mark.parametrize(("driver", "cuda", "words"), [
    ("535", "99.9", "CUDA 99.9 needs driver 590.44.01 or newer"),
    ("535.183.01", "12.4", "CUDA 12.4 needs driver 550.54.14 or newer"),
    ("575.57.08", "13.0", "CUDA 13.0 needs driver 580.65.06 or newer"),
    ("535.54.02", "12.2", "CUDA 12.2 needs driver 535.54.03 or newer"),
    ("535.183.01", "twelve", "is not a CUDA version like 12.2"),
])
def test_a_cuda_the_driver_cannot_support_is_refused(driver, cuda, words):
    created = _node()
    assert_refused(_post(created.runner_token, driver=driver, cuda=cuda), "cuda_version",
                   contains=words)
    created.node.refresh_from_db()
    assert created.node.cuda_version == "" and not Gpu.every.exists()  # nothing written


@pytest.mark.parametrize(("driver", "cuda"), [("535", "12.2"), ("535.54.03", "12.2"),
                                              ("590.44.01", "13.1"), ("560.35.03", "12.6"),
                                              ("550.54.14", "12.4"), ("575.51.03", "12.9")])
def test_a_cuda_within_the_driver_is_accepted(driver, cuda):
    assert _post(_node().runner_token, driver=driver, cuda=cuda).status_code == 200


def test_the_table_is_nvidias_for_the_briefs_examples():
    assert cuda_driver.MIN_DRIVER[12, 2] == (535, 54, 3)
    assert cuda_driver.MIN_DRIVER[12, 4] == (550, 54, 14)
    assert cuda_driver.MIN_DRIVER[13, 0] == (580, 65, 6)


def test_the_all_zero_uuid_is_refused():
    created = _node()
    gpu = {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "product_name": "NVIDIA H200",
           "gpu_class": "h200-sxm-141gb", "memory_mib": 143771,
           "pci_bus_id": "00000000:83:00.0", "mig_mode": "Disabled"}
    assert_refused(_post(created.runner_token, driver="590.48.01", cuda="13.1", gpus=[gpu]),
                   "gpus[0].uuid", contains="all-zero UUID, which NVML never reports")
    assert not Gpu.every.exists()


def test_a_mig_enabled_gpu_sent_whole_is_registered_unlisted_with_a_warning():
    created = _node()
    item = A100_MIG.gpus[0].as_protocol()  # listed (true) by default: an older runner
    answer = _post(created.runner_token, driver="535.54.03", cuda="12.2", gpus=[item])
    assert answer.status_code == 200, answer.content
    assert any("MIG-enabled with no MIG slices: registered, not offered" in w
               for w in answer.json()["warnings"])
    assert Gpu.every.get(uuid=item["uuid"]).listed is False
    assert not Gpu.objects.filter(node=created.node).exists()
