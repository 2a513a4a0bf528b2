"""The fault table, case by case: each cause the runner (or the marketplace) writes today
maps to one failure code, side and credit (marketplace/faults.py, docs/FAULTS.md). The
causes are made by the runner's own code where it has a function for them."""

from __future__ import annotations

import pytest

from marketplace.faults import BUYER, FAULT_TABLE, PROVIDER, UNKNOWN, classify, gpu_of
from providers.runner import health
from providers.runner.health import Finding
from providers.runner.xid import parse_kernel_log

GPU = "GPU-0a1b2c3d-0000-1111-2222-333344445555"


def xid_cause(line: str) -> str:
    [event], _ = parse_kernel_log(line)
    from dataclasses import replace

    return health.xid(replace(event, uuid=GPU)).cause


CASES = [
    (xid_cause("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."), "gpu_xid"),
    (xid_cause("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout"),
     "gpu_xid"),
    (health.gpu_lost({"uuid": GPU, "lost": True}).cause, "gpu_lost"),
    (health.temperature({"uuid": GPU, "temperature_c": 95, "slowdown_temp_c": 88}).cause,
     "gpu_temperature"),
    (health.ecc_uncorrectable({"uuid": GPU, "ecc_uncorrectable": 2}).cause, "gpu_ecc"),
    (health.retired_pages({"uuid": GPU, "retired_pages": 64}).cause, "gpu_retired_pages"),
    (Finding(GPU, "row_remap", "fatal", "row remapping failure").cause, "gpu_row_remap"),
    ("GPU check failed: the container sees GPU-x, not GPU-y", "gpu_check_failed"),
    ("node node-a missed heartbeats since 2026-12-01T12:03:10+00:00", "node_silent"),
    ("the lease's container is gone (removed outside the runner)", "container_lost"),
    ("the runner restarted with the process runtime and stopped the lease's docker "
     "workload 1234abcd", "runtime_replaced"),
    ("Docker failed to start busybox: Error while fetching server API version",
     "runtime_failed"),
    ("Docker refused to start busybox: no space left on device", "runtime_failed"),
    ("the process runtime needs a command (it cannot run an image)", "runtime_failed"),
    ("container exited with status 1", "workload_exit"),
    ("container exited with status 137", "workload_exit"),
    (Finding(GPU, "process_left", "fatal", "pid 7 /usr/bin/python still holds the GPU after "
             "lease 3's workload was removed").cause, "process_left"),
    ("Docker refused to start nosuch/image:1: pull access denied for nosuch/image, "
     "repository does not exist", "image_invalid"),
    ("Docker refused to start x:1: No such image: x:1", "image_invalid"),
    # the runner's background pull (docs/IMAGES.md): a missing image is the buyer's, and
    # so is any other failed pull (the buyer chose the registry: never the provider's)
    ("image 127.0.0.1:5000/a/b:1 could not be pulled: manifest for 127.0.0.1:5000/a/b:1 "
     "not found: manifest unknown: manifest unknown", "image_invalid"),
    ("image 127.0.0.1:5000/a/b:1 could not be pulled: Get \"http://127.0.0.1:5000/v2/\": "
     "dial tcp 127.0.0.1:5000: connect: connection refused", "image_unavailable"),
    ("image 127.0.0.1:27998/ghost/img:1 could not be pulled: Get "
     "\"http://127.0.0.1:27998/v2/\": dial tcp 127.0.0.1:27998: connect: connection refused",
     "image_unavailable"),
    ("image 127.0.0.1:5000/a/b:1 could not be pulled: unexpected EOF", "image_unavailable"),
    ("image 127.0.0.1:5000/a/b:1 could not be pulled: read tcp 127.0.0.1:40000->127.0.0.1:"
     "5000: read: connection reset by peer", "image_unavailable"),
    ("the lease names no image", "image_invalid"),
    ("checkpoint restore failed: AccessDenied: the access key is not valid",
     "checkpoint_restore_failed"),
    ("the workspace holds 20480 bytes, over the bid's checkpoint max_bytes (10240)",
     "checkpoint_over_bound"),
    ("the runner reported a failure", "unknown"),
    ("", "unknown"),
    (Finding(GPU, "pcie_link", "fatal", "made up").cause, "unknown"),  # no fatal pcie rule
]


@pytest.mark.parametrize(("cause", "code"), CASES, ids=[c for _, c in CASES])
def test_each_cause_has_its_code_side_and_credit(cause, code):
    fault = classify(cause)
    assert fault.code == code
    rule = FAULT_TABLE[code]
    assert (fault.side, fault.credit) == (rule.side, rule.credit)
    assert fault.evidence == cause.strip()


def test_the_table_puts_hardware_and_node_faults_on_the_provider_and_the_workload_on_the_buyer():
    provider = {c for c, r in FAULT_TABLE.items() if r.side == PROVIDER}
    buyer = {c for c, r in FAULT_TABLE.items() if r.side == BUYER}
    assert {"gpu_xid", "gpu_lost", "node_silent", "container_lost", "runtime_failed"} <= provider
    assert buyer == {"workload_exit", "process_left", "image_invalid", "image_unavailable",
                     "checkpoint_restore_failed", "checkpoint_over_bound"}
    assert FAULT_TABLE["unknown"].side == UNKNOWN
    # the provider pays for every fault of its own, never for another
    assert all(r.credit == (r.side == PROVIDER) for r in FAULT_TABLE.values())


def test_no_failed_pull_is_the_provider_s_fault():
    for cause, _ in CASES:
        if " could not be pulled: " in cause:
            fault = classify(cause)
            assert (fault.side, fault.credit) == (BUYER, False), cause


def test_gpu_of_names_the_finding_s_gpu():
    assert gpu_of(xid_cause("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")) \
        == GPU
    assert gpu_of("container exited with status 1") == ""
