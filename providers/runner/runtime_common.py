"""What both lease runtimes (runtime.DockerRuntime, process_runtime.ProcessRuntime) share."""

from __future__ import annotations


class RuntimeFailure(RuntimeError):
    """A workload could not be started or inspected; the message says why."""


def lease_env(lease: dict) -> dict[str, str]:
    """The lease's env plus NVIDIA_VISIBLE_DEVICES = comma-joined leased GPU UUIDs."""
    env = {str(k): str(v) for k, v in (lease.get("env") or {}).items()}
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(lease.get("gpu_uuids") or [])
    return env
