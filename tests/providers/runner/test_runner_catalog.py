"""The runner's side of an unknown GPU product: `doctor` names the product and how to get it
added (one file, one test; docs/CATALOG.md). NVML is replaced by a stand-in that reports an
unknown board, the one part that cannot run here (no GPU)."""

from __future__ import annotations

from providers.runner import doctor
from providers.runner.catalog import gpu_class_for


class _UnknownBoard:
    def inventory(self):
        return gpu_class_for("NVIDIA B300")  # raises: not in the catalog


def test_doctor_names_an_unknown_product_and_how_to_get_it_added(monkeypatch):
    monkeypatch.setattr(doctor, "NvmlGpus", _UnknownBoard)
    ok, line = doctor.doctor_checks(None, None)[0]
    assert ok is False and line.startswith("FAIL  NVIDIA driver / NVML: unknown GPU product "
                                           "'NVIDIA B300'")
    assert "one file and one test" in line
    assert "fix: this GPU model has no marketplace class yet: one file, one test" in line
    assert "install the NVIDIA datacenter driver" not in line
