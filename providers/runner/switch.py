"""Which runtime `run` uses, and the workloads a previous runner of this node left in the
other one.

pick_runtime: `auto` and `docker` are Docker, or a RuntimeFailure (exit 1) when no engine
answers: local processes are never chosen automatically, with --simulate or without;
`process` is process_runtime.ProcessRuntime, only as root (not root: only with --simulate,
with a warning that the workload can read the token) and never with --token on the command
line; its notice (what it does not isolate) is logged.

The other runtime's workloads (a previous runner ran with `--runtime process` and this one
with Docker, or the other way round) are found at the first reconciliation and stopped, so
none runs on unwatched and unbilled (stop_previous).

For each such workload: a lease the marketplace lists as `running` is reported `failed`
(cause: the runtime switch; usage_seconds up to now, the buyer pays the seconds used, as
for any provider-side failure) after its last log tail is sent; then the workload is
stopped and removed in its runtime, and its GPUs go through the release check
(Agent.check_released). A `pending`/`starting` lease's workload is only stopped: the
current runtime starts it afresh. One that the marketplace no longer lists is stopped.
"""

from __future__ import annotations

from pathlib import Path

from .client import MarketplaceError, Unauthorized
from .lease import RunnerLease
from .logtail import LOG_LINES, lease_tail
from .runtime import DockerRuntime, ProcessRuntime
from .runtime_common import RuntimeFailure
from .workspace import Workspaces


def pick_runtime(name: str, state_dir: Path, node: str | None, *, simulate: bool,
                 token_on_command_line: bool, uids: range, network_mode: str | None = None,
                 public_host: str | None = None, advertise_host: str | None = None, log=print):
    """The runtime for `--runtime NAME` (auto, docker or process; module docstring).
    RuntimeFailure, with what to do, when it cannot or may not be used."""
    if name == "process":
        if token_on_command_line:
            raise RuntimeFailure(
                "--token on the command line is readable by every process of this host "
                "(`ps`, /proc/<pid>/cmdline), the process runtime's lease workloads included: "
                "run `gpumarket-runner register` once (it saves the token 0600 in the state "
                "dir) or set GPUMARKET_RUNNER_TOKEN")
        runtime = ProcessRuntime(state_dir, uids=uids)
        if not runtime.isolated:
            if not simulate:
                raise RuntimeFailure(
                    "the process runtime gives each lease a user of its own, which needs "
                    "root: run the runner as root, or use Docker (--runtime docker); as "
                    "another user it runs workloads only with --simulate, for a local demo")
            log("WARNING: the runner is not root, so lease workloads run as its own user and "
                "CAN READ ITS TOKEN, CONFIG AND STATE DIR; allowed only with --simulate, for "
                "a local demo: never sell a node like this")
        log(runtime.notice())
        return runtime
    try:
        return DockerRuntime(node, network_mode=network_mode, simulate=simulate,
                             public_host=public_host, advertise_host=advertise_host,
                             keys_dir=state_dir / "authorized_keys",
                             workspaces=Workspaces(state_dir / "workspaces"),
                             notice_root=state_dir / "notice")
    except RuntimeFailure as exc:
        if name == "docker":
            raise
        raise RuntimeFailure(
            f"{exc}: `--runtime auto` runs lease workloads only in Docker containers, never as "
            "local processes (they isolate much less); start the engine (`systemctl enable "
            "--now docker`), or choose the process runtime knowingly with `--runtime "
            "process` (README)") from None


def previous_runtimes(runtime, state_dir: Path, node: str | None) -> list:
    """The other runtime a previous runner of this state dir may have left workloads in:
    the process runtime's processes.json when `runtime` is Docker; this node's containers
    when it is the process runtime and an engine answers (none run otherwise)."""
    if isinstance(runtime, DockerRuntime):
        if (state_dir / "processes" / "processes.json").exists():
            return [ProcessRuntime(state_dir)]
        return []
    try:  # its keys_dir too: stopping a previous SSH lease removes its authorized_keys
        return [DockerRuntime(node, keys_dir=state_dir / "authorized_keys")]
    except RuntimeFailure:
        return []


def _handle(handle: str) -> str:
    return handle if handle.startswith("pid-") else handle[:12]


def stop_previous(agent, listed: dict[int, RunnerLease]) -> None:
    """Stop the workloads of `agent.previous_runtimes` (a list of runtimes, emptied once
    each is done) against `listed` ({lease id: lease} from GET /leases/). A runtime that
    cannot be read now is tried again on the next reconciliation; marketplace outages and
    401 propagate (the loop retries or exits)."""
    for old in list(agent.previous_runtimes):
        try:
            handles = old.list_leases()
        except (RuntimeFailure, OSError) as exc:
            agent.log(f"cannot list the {old.name} workloads of a previous runner: {exc}")
            continue
        for lease_id, handle in sorted(handles.items()):
            lease = listed.get(lease_id)
            gpus = next((w["gpus"].split(",") for w in old.describe()
                         if w["lease"] == lease_id and w.get("gpus")), [])
            what = f"{old.name} workload {_handle(handle)}"
            reported = ""
            if lease is not None and lease.status == "running":
                try:
                    agent.client.post_logs(lease_id, lease_tail(old.logs(lease_id, LOG_LINES),
                                                           lease.secrets.values()))
                except (MarketplaceError, RuntimeFailure) as exc:
                    if isinstance(exc, Unauthorized):
                        raise
                cause = (f"the runner restarted with the {agent.runtime.name} runtime and "
                         f"stopped the lease's {what}")
                agent._event(lease_id, "failed", container_id=handle, cause=cause,
                             usage_seconds=agent._usage(lease))
                reported = "; lease reported failed"
            old.stop(lease_id, agent.grace_s)
            agent.log(f"lease {lease_id}: {what}, left by a previous runner, stopped and "
                      f"removed (this runner uses the {agent.runtime.name} runtime){reported}")
            agent.check_released(lease_id, gpus)
        agent.previous_runtimes.remove(old)
