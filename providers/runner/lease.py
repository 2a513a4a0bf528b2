"""A lease as the runner sees it: one item of GET /api/v1/runner/leases/, parsed once.

The client (client.py) parses each item into a RunnerLease; the agent and the runtimes
read its attributes. Fields as docs/RUNNER_PROTOCOL.md lists them; unknown fields are
ignored (the protocol is additive), a missing one takes the value the runner always
assumed for it (below). Only `id` is required.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunnerLease:
    """id: the marketplace's lease id; status: "pending" | "starting" | "running" (None if
    absent); image: the container image (None if absent: the Docker runtime refuses it);
    command: argv (None: the image's own); gpu_uuids: the leased GPUs (NVML UUIDs); env:
    str → str for the workload; duration_seconds; started_at, ends_at, preempt_at: ISO 8601
    strings as sent, or None; ports: container TCP ports to publish; port_roles: container
    port (string) → role ("ssh", "jupyter", "http"); ssh_authorized_keys: the buyer's SSH
    public keys (OpenSSH lines) the workload's authorized_keys holds ([]: no SSH);
    secrets: str → str, the buyer's secrets in clear (into the workload's environment
    only, and redacted from the log tail: never logged, never in repr); stop_requested:
    the buyer stopped it (its workload is stopped and removed, as for a lease no longer
    listed); chain_id: the id of the chain's first lease (its own on a first lease);
    checkpoint: the bid's checkpoint store with its credentials in clear ({endpoint_url,
    bucket, prefix, region, access_key_id, secret_access_key, path, max_bytes, restore};
    checkpoint.py), None without one — never in repr; notice: None or {"reason",
    "deadline", "since"} (ISO 8601), a deadline the lease did not have, for its workload
    (notice.py); notice_signal: "" or the signal its workload gets with a notice
    ("SIGUSR1", …); stop_grace_seconds: seconds between SIGTERM and SIGKILL at the stop
    (None: the runner's default; bounded by notice.py)."""

    id: int
    status: str | None = None
    image: str | None = None
    command: list[str] | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    duration_seconds: int | None = None
    started_at: str | None = None
    ends_at: str | None = None
    preempt_at: str | None = None
    ports: list[int] = field(default_factory=list)
    port_roles: dict[str, str] = field(default_factory=dict)
    ssh_authorized_keys: list[str] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    stop_requested: bool = False
    chain_id: int | None = None
    checkpoint: dict | None = field(default=None, repr=False)
    notice: dict | None = None
    notice_signal: str = ""
    stop_grace_seconds: int | None = None

    @classmethod
    def parse(cls, item: Mapping) -> RunnerLease:
        """One list item (a JSON object) → RunnerLease. KeyError without `id`; ValueError
        or TypeError when `id` is not a whole number."""
        return cls(
            id=int(item["id"]),
            status=item.get("status"),
            image=item.get("image"),
            command=item.get("command"),
            gpu_uuids=list(item.get("gpu_uuids") or []),
            env=dict(item.get("env") or {}),
            duration_seconds=item.get("duration_seconds"),
            started_at=item.get("started_at"),
            ends_at=item.get("ends_at"),
            preempt_at=item.get("preempt_at"),
            ports=list(item.get("ports") or []),
            port_roles={str(k): str(v) for k, v in (item.get("port_roles") or {}).items()},
            ssh_authorized_keys=[str(k) for k in item.get("ssh_authorized_keys") or []],
            secrets={str(k): str(v) for k, v in (item.get("secrets") or {}).items()},
            stop_requested=item.get("stop_requested") is True,
            chain_id=int(item["chain_id"]) if item.get("chain_id") is not None else None,
            checkpoint=dict(item["checkpoint"]) if isinstance(item.get("checkpoint"), Mapping)
            else None,
            notice=_notice(item.get("notice")),
            notice_signal=str(item.get("notice_signal") or ""),
            stop_grace_seconds=item.get("stop_grace_seconds"),
        )

    @classmethod
    def of(cls, lease: RunnerLease | Mapping) -> RunnerLease:
        """`lease` itself, or a list item as the marketplace sends it, parsed (callers that
        hold the wire form: tests, the marketplace's own runner_lease)."""
        return lease if isinstance(lease, RunnerLease) else cls.parse(lease)


def _notice(value) -> dict | None:
    """The payload's `notice` as {reason, deadline, since} (strings), None when absent or
    not an object with a deadline."""
    if not isinstance(value, Mapping) or not value.get("deadline"):
        return None
    return {key: str(value.get(key) or "") for key in ("reason", "deadline", "since")}
