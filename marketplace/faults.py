"""Who caused a failed lease: the fault table (docs/FAULTS.md).

The runner's evidence decides: the cause it reports with `failed` (marketplace/api/
runner.py; the runner writes it from its finding, providers/runner/health.py
`Finding.cause` = "GPU <uuid>: <rule>: <evidence>", or from its runtime) and the
marketplace's own (health.fail_silent_nodes: "node <name> missed heartbeats since …").
`classify(cause)` maps that text to a failure code; `FAULT_TABLE` maps each code to the
side that caused it and whether the provider pays the buyer a credit. A cause that
matches no row is `unknown`: nobody's fault as far as the evidence shows (no credit, no
failover).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROVIDER = "provider"
BUYER = "buyer"
UNKNOWN = ""


@dataclass(frozen=True)
class Rule:
    """side: "provider" | "buyer" | "" (unknown); credit: the provider pays the buyer
    the fault credit (settlement.services.fault_credit); what: the row in words."""

    side: str
    credit: bool
    what: str


#: failure code → rule. The one table; docs/FAULTS.md lists it for people.
FAULT_TABLE: dict[str, Rule] = {
    "gpu_xid": Rule(PROVIDER, True, "a fatal XID (NVIDIA's catalog: reset the GPU or "
                                    "reboot the node)"),
    "gpu_lost": Rule(PROVIDER, True, "the GPU no longer answers (fell off the bus)"),
    "gpu_temperature": Rule(PROVIDER, True, "the GPU at its HW slowdown temperature"),
    "gpu_ecc": Rule(PROVIDER, True, "uncorrectable ECC errors"),
    "gpu_retired_pages": Rule(PROVIDER, True, "the GPU's page retirement limit reached"),
    "gpu_row_remap": Rule(PROVIDER, True, "a GPU memory row remapping failure"),
    "gpu_check_failed": Rule(PROVIDER, True, "the container did not get the leased GPUs"),
    "node_silent": Rule(PROVIDER, True, "the node missed its heartbeats"),
    "container_lost": Rule(PROVIDER, True, "the lease's container vanished from the runtime"),
    "runtime_replaced": Rule(PROVIDER, True, "the runner restarted with another runtime "
                                             "and stopped the workload"),
    "runtime_failed": Rule(PROVIDER, True, "the provider's container runtime failed to "
                                           "start the workload"),
    "workload_exit": Rule(BUYER, False, "the workload exited with a non-zero status"),
    "process_left": Rule(BUYER, False, "a workload's process stayed on the GPU"),
    "image_invalid": Rule(BUYER, False, "the image the buyer named does not exist or "
                                        "cannot be pulled by anyone"),
    # the buyer chose the image and its registry; a node whose network is down is caught
    # by the silent-node and heartbeat rules (docs/FAULTS.md)
    "image_unavailable": Rule(BUYER, False, "the image could not be pulled from its "
                                            "registry (unreachable, died mid-pull, …)"),
    "checkpoint_restore_failed": Rule(BUYER, False, "the buyer's checkpoint store could not "
                                                    "be read (credentials, bucket)"),
    "checkpoint_over_bound": Rule(BUYER, False, "the workspace grew over the bid's "
                                                "checkpoint max_bytes"),
    "unknown": Rule(UNKNOWN, False, "the evidence names no cause"),
}

# health.py rule names (Finding.rule) → code
_GPU_RULES = {"xid": "gpu_xid", "gpu_lost": "gpu_lost", "temperature": "gpu_temperature",
              "ecc_uncorrectable": "gpu_ecc", "retired_pages": "gpu_retired_pages",
              "row_remap": "gpu_row_remap", "process_left": "process_left"}
_FINDING = re.compile(r"^GPU (?P<uuid>(?:GPU|MIG)-[0-9A-Za-z-/]+): (?P<rule>[a-z_]+): ")
# what Docker says when the image is the buyer's mistake (no such image or repository)
_BAD_IMAGE = re.compile(r"no such image|not found|manifest unknown|pull access denied|"
                        r"repository does not exist|invalid reference format", re.I)
#: (pattern on the cause, code), tried in order after the finding form
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^node .+ missed heartbeats since "), "node_silent"),
    (re.compile(r"^the lease's container is gone"), "container_lost"),
    (re.compile(r"^the runner restarted with the \S+ runtime"), "runtime_replaced"),
    (re.compile(r"^GPU check failed: "), "gpu_check_failed"),
    (re.compile(r"^container exited with status -?\d+"), "workload_exit"),
    (re.compile(r"^the lease names no image"), "image_invalid"),
    (re.compile(r"^Docker (refused|failed) to start "), "runtime_failed"),
    # the runner's background pull (providers/runner/pull.py; docs/IMAGES.md)
    (re.compile(r"^image \S+ could not be pulled: "), "image_unavailable"),
    (re.compile(r"^the process runtime needs a command"), "runtime_failed"),
    # the checkpoint runner (providers/runner/checkpoint.py, issue 15's ckpt)
    (re.compile(r"^checkpoint restore failed: "), "checkpoint_restore_failed"),
    (re.compile(r"^the workspace holds \d+ bytes, over the bid's checkpoint max_bytes"),
     "checkpoint_over_bound"),
)


@dataclass(frozen=True)
class Fault:
    """A classified failure: code (a FAULT_TABLE key), side, credit, evidence (the cause
    text the code was read from)."""

    code: str
    side: str
    credit: bool
    evidence: str


def classify(cause: str) -> Fault:
    """The fault of a lease that failed with `cause` (the runner's or the marketplace's
    text, as stored in Lease.cause)."""
    text = (cause or "").strip()
    code = "unknown"
    found = _FINDING.match(text)
    if found:
        code = _GPU_RULES.get(found["rule"], "unknown")
    else:
        for pattern, name in _PATTERNS:
            if pattern.search(text):
                code = name
                break
        if code in ("runtime_failed", "image_unavailable") \
                and text.startswith(("Docker refused", "image ")) \
                and _BAD_IMAGE.search(text.split(": ", 1)[-1]):
            code = "image_invalid"
    rule = FAULT_TABLE[code]
    return Fault(code=code, side=rule.side, credit=rule.credit, evidence=text)


def gpu_of(evidence: str) -> str:
    """The GPU (or MIG) UUID a finding names, "" when it names none."""
    found = _FINDING.match(evidence or "")
    return found["uuid"] if found else ""
