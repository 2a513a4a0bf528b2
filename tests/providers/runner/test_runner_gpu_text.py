"""How inventory and doctor word MIG devices and NVLinks (gpu_text)."""

from __future__ import annotations

from dataclasses import replace

from providers.runner.gpu_text import doctor_lines, mig_summary, nvlink_summary
from providers.runner.nvsmi import NvLinkInfo, parse_dump

from .runner_helpers import DUMPS, H100

H200_MIG = DUMPS / "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt"


def test_mig_summary_counts_profiles_in_index_order():
    [gpu] = parse_dump(H200_MIG, classify=False).gpus
    assert mig_summary(gpu) == "MIG Enabled: 2 \u00d7 3g.71gb, 1 \u00d7 2g.35gb, 2 \u00d7 1g.18gb"
    assert mig_summary(parse_dump(H100).gpus[0]) == "MIG Disabled"


def test_doctor_fails_a_mig_gpu_without_devices_and_a_partly_down_nvlink():
    gpu = parse_dump(H100).gpus[0]
    links = tuple(NvLinkInfo(n, n != 5, None) for n in range(18))
    checks = doctor_lines([replace(gpu, mig_mode="Enabled"), replace(gpu, nvlinks=links),
                           replace(gpu, nvlinks=links[:5])])
    assert [(ok, name) for ok, name, _d, _f in checks] == [
        (False, "MIG"), (False, "NVLink"), (True, "NVLink")]
    assert checks[0][2] == "GPU 0 NVIDIA H100 80GB HBM3 MIG Enabled: no MIG devices listed"
    assert "nvidia-smi mig -cgi" in checks[0][3]
    assert checks[1][2] == "GPU 1 NVIDIA H100 80GB HBM3 NVLink: 17/18 links active"
    assert nvlink_summary(gpu) is None
