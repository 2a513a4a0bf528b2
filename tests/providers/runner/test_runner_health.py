"""Health rules: each threshold from both sides, and the rules on the recorded dumps."""

from __future__ import annotations

import pytest

from providers.runner import health
from providers.runner.health import Finding, evaluate
from providers.runner.nvml import DumpGpus
from providers.runner.xid import XidEvent

from .runner_helpers import A10, H100, RTX4090, TITAN_V

U = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"


def sev(rule, **reading) -> str | None:
    finding = rule({"uuid": U, **reading})
    return None if finding is None else finding.severity


def test_temperature_against_the_gpus_own_slowdown_threshold():
    assert sev(health.temperature, temperature_c=82, slowdown_temp_c=88) == "ok"
    assert sev(health.temperature, temperature_c=83, slowdown_temp_c=88) == "warn"
    assert sev(health.temperature, temperature_c=87, slowdown_temp_c=88) == "warn"
    assert sev(health.temperature, temperature_c=88, slowdown_temp_c=88) == "fatal"
    # The threshold is the GPU's own: 90 °C is fine for a GPU that slows down at 97 °C.
    assert sev(health.temperature, temperature_c=90, slowdown_temp_c=97) == "ok"
    # No threshold known: no finding, never a guessed one.
    assert sev(health.temperature, temperature_c=120, slowdown_temp_c=None) is None
    finding = health.temperature({"uuid": U, "temperature_c": 95, "slowdown_temp_c": 88})
    assert finding.evidence == "95 °C at or above the GPU's HW slowdown threshold 88 °C"


def test_uncorrectable_ecc():
    assert sev(health.ecc_uncorrectable, ecc_uncorrectable=0) == "ok"
    assert sev(health.ecc_uncorrectable, ecc_uncorrectable=1) == "fatal"
    assert sev(health.ecc_uncorrectable, ecc_uncorrectable=None) is None


def test_retired_pages():
    assert sev(health.retired_pages, retired_pages=63, retired_pages_pending=False) == "ok"
    assert sev(health.retired_pages, retired_pages=64, retired_pages_pending=False) == "fatal"
    assert sev(health.retired_pages, retired_pages=2, retired_pages_pending=True) == "warn"
    assert sev(health.retired_pages, retired_pages=None, retired_pages_pending=None) is None


def test_row_remap():
    assert sev(health.row_remap, remapped_rows_pending=False, remapping_failure=False) == "ok"
    assert sev(health.row_remap, remapped_rows_pending=True, remapping_failure=False) == "warn"
    assert sev(health.row_remap, remapped_rows_pending=False, remapping_failure=True) == "fatal"
    assert sev(health.row_remap, remapped_rows_pending=None, remapping_failure=None) is None


def test_clock_event_reasons():
    assert sev(health.hw_thermal_slowdown, hw_thermal_slowdown=False) == "ok"
    assert sev(health.hw_thermal_slowdown, hw_thermal_slowdown=True) == "warn"
    assert sev(health.hw_power_brake, hw_power_brake=False) == "ok"
    assert sev(health.hw_power_brake, hw_power_brake=True) == "warn"
    assert sev(health.hw_power_brake, hw_power_brake=None) is None


def test_pcie_link_degraded_only_counts_under_load():
    link = {"pcie_gen_current": 1, "pcie_gen_max": 4, "pcie_width_current": 16,
            "pcie_width_max": 16}
    assert sev(health.pcie_link, utilization_pct=49, **link) == "ok"  # idle links downtrain
    assert sev(health.pcie_link, utilization_pct=50, **link) == "warn"
    narrow = {**link, "pcie_gen_current": 4, "pcie_width_current": 8}
    assert sev(health.pcie_link, utilization_pct=100, **narrow) == "warn"
    full = {**link, "pcie_gen_current": 4}
    assert sev(health.pcie_link, utilization_pct=100, **full) == "ok"
    assert sev(health.pcie_link, utilization_pct=100, **{**link, "pcie_gen_max": None}) is None


def test_gpu_lost():
    assert sev(health.gpu_lost, lost=False) == "ok"
    assert sev(health.gpu_lost, lost=True) == "fatal"
    finding = health.gpu_lost({"uuid": U, "lost": True, "lost_reason": "NVML: GPU is lost"})
    assert finding.evidence == "NVML: GPU is lost"


@pytest.mark.parametrize(("code", "severity", "action"), [
    (48, "fatal", "WORKFLOW_XID_48"), (63, "warn", "IGNORE"), (64, "fatal", "RESET_GPU"),
    (74, "fatal", "WORKFLOW_NVLINK_ERR"), (79, "fatal", "RESTART_BM"), (92, "warn", "IGNORE"),
    (94, "warn", "RESTART_APP"), (95, "fatal", "RESET_GPU"), (119, "fatal", "RESET_GPU"),
    (120, "fatal", "RESET_GPU"), (13, "warn", "RESTART_APP"), (31, "warn", "RESTART_APP"),
    (4242, "warn", "UNKNOWN"),
])
def test_xid_classified_by_nvidias_catalog(code, severity, action):
    finding = health.xid(XidEvent(code, "0000:53:00", uuid=U, message="m"))
    assert finding.severity == severity
    assert f"NVIDIA immediate action {action}" in finding.evidence


def test_xid_154_is_fatal_only_when_it_asks_for_a_reset_or_reboot():
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    none = "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
    assert health.xid(XidEvent(154, None, uuid=U, message=reboot)).severity == "fatal"
    assert health.xid(XidEvent(154, None, uuid=U, message=none)).severity == "warn"
    assert health.xid(XidEvent(79, "0000:01:00", uuid=None)) is None  # not one of ours


def test_cause_is_capped_at_300_characters():
    finding = Finding(U, "xid", "fatal", "x" * 500)
    assert len(finding.cause) == 300
    assert finding.cause.startswith(f"GPU {U}: xid: xxx")
    with pytest.raises(ValueError):
        Finding(U, "xid", "bad", "")


def readings(path) -> list[dict]:
    gpus = DumpGpus(path)
    return gpus.sample_health([g.uuid for g in gpus.inventory().gpus])


def test_recorded_hosts_are_healthy_but_for_two_real_warnings():
    for path in (RTX4090, TITAN_V):
        assert {f.severity for f in evaluate(readings(path))} == {"ok"}, path.name
    # The third H100 of the recording reports "HW Power Brake Slowdown : Active": a warning.
    [brake] = [f for f in evaluate(readings(H100)) if f.severity != "ok"]
    assert (brake.uuid, brake.rule, brake.severity) == (
        "GPU-973565ff-45cf-12ea-4e91-33386720f7bb", "hw_power_brake", "warn")
    # The recorded A10 has a row remap pending (4 uncorrectable rows, reset not yet done).
    [bad] = [f for f in evaluate(readings(A10)) if f.severity != "ok"]
    assert (bad.rule, bad.severity) == ("row_remap", "warn")
    # The RTX 4090s idle at PCIe Gen 1 of 4: not a finding, they are not under load.
    rtx = [f for f in evaluate(readings(RTX4090)) if f.rule == "pcie_link"]
    assert rtx[0].evidence == "Gen1 x16 of Gen4 x16, not under load"


def test_replayed_readings_drive_the_rules():
    gpus = DumpGpus(H100, replay_health={U: {"temperature_c": 95, "ecc_uncorrectable": 3}})
    findings = [f for f in evaluate(gpus.sample_health([U])) if f.severity != "ok"]
    assert [(f.rule, f.severity) for f in findings] == [
        ("temperature", "fatal"), ("ecc_uncorrectable", "fatal")]
    assert findings[0].evidence == "95 °C at or above the GPU's HW slowdown threshold 88 °C"
