"""What both lease runtimes (runtime.DockerRuntime, process_runtime.ProcessRuntime) share:
the Runtime interface the agent drives, RuntimeFailure, and the workload's environment.
runtime.py's docstring says what each method does in each runtime."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from .lease import RunnerLease


class RuntimeFailure(RuntimeError):
    """A workload could not be started or inspected; the message says why."""


@runtime_checkable
class Runtime(Protocol):
    """Where lease workloads run, keyed by the marketplace's lease id. A method taking a
    lease accepts a RunnerLease or its wire form (RunnerLease.of)."""

    name: str  # "docker" | "process": the heartbeat's `runtime`
    node: str | None  # the node label of workloads; None until Agent.announce sets it
    last_check: str  # what the last verify_gpus saw, for the log

    def start(self, lease: RunnerLease | Mapping) -> str: ...
    def stop(self, lease_id: int, grace_s: float = 10) -> None: ...
    def notice_dir(self, lease_id: int) -> Path: ...
    def send_signal(self, lease_id: int, name: str) -> None: ...
    def list_leases(self) -> dict[int, str]: ...
    def describe(self) -> list[dict]: ...
    def exit_status(self, lease_id: int) -> int | None: ...
    def logs(self, lease_id: int, lines: int = 200) -> str: ...
    def verify_gpus(self, lease: RunnerLease | Mapping) -> str | None: ...
    def endpoints(self, lease: RunnerLease | Mapping) -> list[dict] | None: ...


RESERVED_PREFIXES = ("GPUMARKET_", "NVIDIA_")  # the marketplace's and the runner's own


def lease_env(lease: RunnerLease, notice_file: str = "") -> dict[str, str]:
    """The workload's environment: the lease's env merged with its secrets (a secret or
    env name the marketplace reserves, GPUMARKET_* or NVIDIA_*, is dropped from the
    buyer's part), then GPUMARKET_LEASE_ID = the lease id, GPUMARKET_NOTICE_FILE = where
    its notice appears (notice.py; left out when "") and NVIDIA_VISIBLE_DEVICES =
    comma-joined leased GPU UUIDs, which nothing overrides."""
    env = {str(k): str(v) for k, v in lease.env.items()}
    env.update({str(k): str(v) for k, v in lease.secrets.items()
                if not str(k).startswith(RESERVED_PREFIXES)})
    env["GPUMARKET_LEASE_ID"] = str(lease.id)
    if notice_file:
        env["GPUMARKET_NOTICE_FILE"] = notice_file
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(lease.gpu_uuids)
    return env


def docker_sdk():
    """The Docker SDK (`docker`), loaded without its optional ssh:// transport: where
    paramiko is installed, `import docker` loads it with invoke and cryptography (~18 MB
    resident, bench/README.md "The runner at work"). The runner talks to the local Engine
    (a unix socket or tcp DOCKER_HOST); an ssh:// DOCKER_HOST is refused by the SDK then."""
    if "docker" not in sys.modules and "paramiko" not in sys.modules:
        sys.modules["paramiko"] = None  # the SDK's `try: import paramiko` sees none
        try:
            import docker
        finally:
            del sys.modules["paramiko"]
    import docker

    return docker
