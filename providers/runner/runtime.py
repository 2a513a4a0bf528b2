"""Where lease workloads run: Docker containers, or local processes when the provider
chooses them explicitly (`--runtime process`: process_runtime.py says what they isolate).

Both runtimes share one interface, keyed by the marketplace's lease id (int):
- start(lease) -> handle id: idempotent, a lease never gets two workloads (Docker: with
  the lease's share of the host's memory and CPUs, a pids limit and /dev/shm: limits.py);
- stop(lease_id, grace_s): SIGTERM, SIGKILL after grace_s seconds, then remove;
- notice_dir(lease_id) -> the host directory the workload sees read-only (Docker: at
  notice.MOUNT; processes: GPUMARKET_NOTICE_FILE's) where notice.py writes its notice;
- send_signal(lease_id, name): a signal ("SIGUSR1", …) to the workload, now;
- list_leases() -> {lease id: handle id}: what runs (or ran and is not removed yet),
  found again after a runner restart (Docker: by label; processes: the state dir);
- exit_status(lease_id) -> None while running, the exit code once it has exited;
- logs(lease_id, lines) -> the last `lines` lines of the workload's output (text);
- prepare(lease) -> None when the lease's image is on the engine, else the pull.PullState of
  its background pull (Docker only; docs/IMAGES.md); images_in_use() -> the image refs of
  this node's containers (never evicted from the image cache);
- verify_gpus(lease) -> None if the workload sees exactly the leased GPUs (or the check
  cannot tell), else the evidence of a mismatch (Docker only; processes are not isolated);
- endpoints(lease) -> [{container_port, host, host_port}] where the buyer reaches the
  lease's `ports` (Docker, with a public host); None from the process runtime: a process
  binds where it binds and is not published.

`lease` is a lease.RunnerLease, or its wire form as in GET /api/v1/runner/leases/ (parsed
by RunnerLease.of); the interface is runtime_common.Runtime.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from . import lease_network, notice, ssh_access
from .images import DEFAULT_BOUND, ImageCache
from .lease import RunnerLease
from .limits import Limits, ResourcePolicy
from .process_runtime import ProcessRuntime
from .pull import Puller, PullState, normalize
from .runtime_common import RuntimeFailure, docker_sdk, lease_env
from .workspace import Workspaces

__all__ = ["DockerRuntime", "ProcessRuntime", "RuntimeFailure", "docker_host", "lease_env"]

LEASE_LABEL = "gpumarket.lease"
NODE_LABEL = "gpumarket.node"


UNSPECIFIED_HOSTS = ("0.0.0.0", "::", "")


def port_bindings(ports: list[int] | None, public_host: str | None,
                  network_mode: str | None = None) -> dict[str, tuple[str, None]] | None:
    """The Docker SDK's `ports=` for a lease's container TCP ports: each published on
    `public_host` (an address of this host) at a host port the engine picks,
    {"8888/tcp": ("203.0.113.7", None)}. None when nothing is published: no ports, no
    public host (the runner's default), or a network mode that cannot publish ("none": no
    network; "host": the container already listens on the host's own interfaces)."""
    if not ports or not public_host or network_mode in ("none", "host"):
        return None
    return {f"{int(p)}/tcp": (public_host, None) for p in sorted(set(ports))}


def endpoints_from_ports(port_map: dict | None, ports: list[int] | None,
                         advertise_host: str) -> list[dict]:
    """Where buyers reach the lease's ports, from a container's
    attrs["NetworkSettings"]["Ports"] ({"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort":
    "32768"}], …}): [{"container_port": 8888, "host": advertise_host, "host_port": 32768}],
    in port order. A port the engine did not publish is left out."""
    out = []
    for port in sorted(set(ports or [])):
        for binding in (port_map or {}).get(f"{int(port)}/tcp") or []:
            host_port = str(binding.get("HostPort") or "")
            if host_port.isdigit() and 0 < int(host_port) < 65536:
                out.append({"container_port": int(port), "host": advertise_host,
                            "host_port": int(host_port)})
                break
    return out


class DockerRuntime:
    """Lease containers on a Docker Engine (docker SDK).

    node: value of the `gpumarket.node` label (only this node's containers are adopted);
    network_mode: "per-lease" (default: a bridge network of the lease's own, lease_network.py),
    None for the engine default, "none", "host", or a network's name; simulate: True passes the
    GPUs only as NVIDIA_VISIBLE_DEVICES (no device request, for hosts without a GPU);
    False adds a DeviceRequest(driver="nvidia", device_ids=<uuids>) so the NVIDIA
    container toolkit exposes exactly the leased GPUs.
    public_host: the address of this host on which a lease's `ports` are published (None:
    none are); advertise_host: the name or address buyers connect to (default public_host;
    needed when public_host is 0.0.0.0 or ::). network_mode "none" cannot publish ports.
    Resource limits: `policy` (limits.ResourcePolicy: the default rule unless the provider
    overrode it) and `node_gpus` (GPUs on this node; None: each lease has the whole host),
    against the engine's MemTotal and NCPU; see resource_limits().
    keys_dir: where a lease's authorized_keys file is written (ssh_access.py; the runner
    passes `<state dir>/authorized_keys`); a lease with SSH keys and no keys_dir is
    refused. SSH's port is published like any other: each lease's port 22 gets a host port
    of its own. workspaces: where a lease with a checkpoint store gets its /workspace
    (workspace.Workspaces; the runner passes `<state dir>/workspaces`). notice_root: where
    each lease's notice directory is made (notice.py; the runner passes `<state
    dir>/notice`; None: a directory under the system temp dir). images: the image cache
    (images.ImageCache; default: in memory, DEFAULT_BOUND; the runner passes `<state
    dir>/images.json` and --image-cache), pulled in the background by `puller`.
    Raises RuntimeFailure when no engine answers.
    """

    name = "docker"
    policy: ResourcePolicy = ResourcePolicy()
    node_gpus: int | None = None
    _host: tuple[int, float] | None = None  # (memory bytes, CPUs) as the engine reports

    def __init__(self, node: str | None, *, client=None,
                 network_mode: str | None = lease_network.PER_LEASE,
                 simulate: bool = False, public_host: str | None = None,
                 advertise_host: str | None = None, keys_dir: str | Path | None = None,
                 workspaces: Workspaces | None = None,
                 notice_root: str | Path | None = None,
                 images: ImageCache | None = None) -> None:
        docker = docker_sdk()
        self._docker = docker
        try:
            self.client = client or docker.from_env(timeout=30)
            self.client.ping()
        except Exception as exc:  # DockerException, requests errors, socket errors
            raise RuntimeFailure(
                f"no Docker Engine answers at {docker_host()} ({exc.__class__.__name__})"
            ) from None
        self.node = None if node is None else str(node)  # None: set by Agent.announce()
        self.network_mode = network_mode
        self.simulate = simulate
        self.public_host = public_host or None
        self.advertise_host = advertise_host or public_host or None
        self.last_check = "not run"  # what the last verify_gpus saw, for the log
        self.keys_dir = None if keys_dir is None else Path(keys_dir)
        self.workspaces = workspaces  # a lease's /workspace (workspace.py); None: none
        self.notice_root = Path(notice_root) if notice_root is not None else \
            Path(tempfile.gettempdir()) / "gpumarket-notice"
        self.images = images or ImageCache(self.client, None, DEFAULT_BOUND)
        self.puller = Puller()

    def prepare(self, lease: RunnerLease | Mapping) -> PullState | None:
        """None when the lease's image is on the engine (start() may run now); else the
        state of its pull, started in the background now unless one is under way. A
        finished pull's state ("done" or "failed") is returned until the caller forgets it
        (puller.forget), so the caller reads how it ended. A lease without an image: None
        (start() refuses it)."""
        lease = RunnerLease.of(lease)
        if not lease.image:
            return None
        ref = normalize(lease.image)
        state = self.puller.state(ref)
        if state is not None:
            return state
        if self.images.present(ref):
            return None
        return self.puller.ensure(ref)

    def images_in_use(self) -> set[str]:
        """The image refs this node's containers were created from (any state)."""
        out = set()
        for container in self._containers():
            ref = (container.attrs.get("Config") or {}).get("Image")
            if ref:
                out.add(normalize(ref))
        return out

    def _containers(self, lease_id: int | None = None) -> list:
        if self.node is None:
            raise RuntimeFailure("DockerRuntime.node is not set (the node id labels containers)")
        labels = [f"{NODE_LABEL}={self.node}"]
        labels.append(f"{LEASE_LABEL}={lease_id}" if lease_id is not None else LEASE_LABEL)
        return self.client.containers.list(all=True, filters={"label": labels})

    def _container_name(self, lease_id: int) -> str:
        safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in self.node)
        return f"gpumarket-{safe}-lease-{lease_id}"

    def _labels(self, lease_id: int) -> dict[str, str]:
        return {LEASE_LABEL: str(lease_id), NODE_LABEL: self.node}

    def notice_dir(self, lease_id: int) -> Path:
        """The lease's notice directory on this host (bind-mounted read-only at
        notice.MOUNT), per node and lease."""
        safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in str(self.node))
        return self.notice_root / f"{safe}-lease-{lease_id}"

    def send_signal(self, lease_id: int, name: str) -> None:
        """Send signal `name` to the lease's container (its init passes it on to the
        workload). RuntimeFailure when it has no running container."""
        for container in self._containers(lease_id):
            try:
                container.kill(signal=name)
            except self._docker.errors.DockerException as exc:
                raise RuntimeFailure(f"cannot signal lease {lease_id}: {exc}") from None
            return
        raise RuntimeFailure(f"lease {lease_id} has no container")

    def volumes_for(self, lease: RunnerLease) -> list[str]:
        """The container's bind mounts (the Docker SDK's `volumes=`, "host:container:mode"):
        the notice directory (read-only, always), the authorized_keys file with SSH keys,
        the workspace at /workspace with a checkpoint store (workspace.py)."""
        volumes = [f"{notice.make_dir(self.notice_dir(lease.id))}:{notice.MOUNT}:ro"]
        if lease.ssh_authorized_keys:
            if self.keys_dir is None:
                raise RuntimeFailure("the lease has SSH keys but this runtime has no "
                                     "directory for authorized_keys files")
            keys = ssh_access.write_keys(self.keys_dir, lease.id, lease.ssh_authorized_keys)
            volumes += ssh_access.volumes(keys)
        if lease.checkpoint:  # issue 15: the workspace at /workspace (workspace.py)
            if self.workspaces is None:
                raise RuntimeFailure("the lease has a checkpoint store but this runtime has "
                                     "no directory for workspaces")
            self.workspaces.create(lease.id)
            volumes += self.workspaces.volumes(lease.id)
        return volumes

    def _cleanup(self, lease_id: int) -> None:
        """Remove what a lease has besides its container: keys file, notice directory,
        own network."""
        ssh_access.remove_keys(self.keys_dir, lease_id)
        shutil.rmtree(self.notice_dir(lease_id), ignore_errors=True)
        if self.network_mode == lease_network.PER_LEASE:
            # still in use (a container we could not remove): the next stop retries
            with contextlib.suppress(self._docker.errors.DockerException):
                lease_network.remove(self.client, self._container_name(lease_id))

    def start(self, lease: RunnerLease | Mapping) -> str:
        """Start the lease's container (detached, init, labelled) and return its id.

        If a container labelled for this lease exists (even stopped), return its id
        instead. Raises RuntimeFailure when the engine refuses (image missing, bad command)
        or the lease names no image (or, with real GPUs, no GPU).
        """
        lease = RunnerLease.of(lease)
        lease_id = lease.id
        existing = self._containers(lease_id)
        if existing:
            return existing[0].id
        kwargs = {}
        if lease.image is None:
            raise RuntimeFailure("the lease names no image")
        if not lease.gpu_uuids and not self.simulate:  # never a container of unknown GPUs
            raise RuntimeFailure("the lease names no GPU")
        bindings = port_bindings(lease.ports, self.public_host, self.network_mode)
        if bindings:
            kwargs["ports"] = bindings
        if not self.simulate:
            kwargs["device_requests"] = [
                self._docker.types.DeviceRequest(
                    driver="nvidia", device_ids=list(lease.gpu_uuids),
                    capabilities=[["gpu"]],
                )
            ]
        kwargs.update(self.resource_limits(lease).docker_kwargs())
        kwargs["volumes"] = self.volumes_for(lease)
        network = self.network_mode
        if network == lease_network.PER_LEASE:
            network = self._container_name(lease_id)
            try:
                lease_network.create(self.client, network, self._labels(lease_id))
            except self._docker.errors.DockerException as exc:
                self._cleanup(lease_id)
                hint = ("; dockerd has no address range left for another network: give it "
                        "more (daemon.json default-address-pools, docs/RUNNER.md)"
                        if "address pool" in str(exc) else "")
                raise RuntimeFailure(f"Docker refused the lease's network {network}: "
                                     f"{exc}{hint}") from None
        try:
            container = self.client.containers.run(
                lease.image,
                command=lease.command or None,
                environment=lease_env(lease, notice.MOUNTED_FILE),
                labels=self._labels(lease_id),
                name=self._container_name(lease_id),
                init=True,
                network_mode=network,
                detach=True,
                **kwargs,
            )
        except self._docker.errors.APIError as exc:
            if exc.status_code == 409:  # name taken: a concurrent start won; adopt it
                existing = self._containers(lease_id)
                if existing:
                    return existing[0].id
            self._cleanup(lease_id)
            raise RuntimeFailure(f"Docker refused to start {lease.image}: "
                                 f"{exc.explanation or exc}") from None
        except self._docker.errors.DockerException as exc:
            self._cleanup(lease_id)
            raise RuntimeFailure(f"Docker failed to start {lease.image}: {exc}") from None
        return container.id

    def endpoints(self, lease: RunnerLease | Mapping) -> list[dict]:
        """Where buyers reach the lease's `ports`: [{container_port, host, host_port}]
        (endpoints_from_ports) as the engine published them; with network mode "host", the
        container ports themselves on the advertised host. [] when nothing is published (no
        public host, no ports, network "none", or the engine bound none)."""
        lease = RunnerLease.of(lease)
        ports = lease.ports
        if not ports or not self.advertise_host or self.network_mode == "none":
            return []
        if self.network_mode == "host":
            return [{"container_port": int(p), "host": self.advertise_host,
                     "host_port": int(p)} for p in sorted(set(ports))]
        found = self._containers(lease.id)
        if not found:
            return []
        network = found[0].attrs.get("NetworkSettings") or {}
        return endpoints_from_ports(network.get("Ports"), ports, self.advertise_host)

    def host_resources(self) -> tuple[int, float]:
        """(memory in bytes, CPUs) the engine can give containers (`docker info` MemTotal
        and NCPU; the host's own when the engine does not say). Read once."""
        if self._host is None:
            try:
                info = self.client.info()
            except self._docker.errors.DockerException:
                info = {}
            memory = int(info.get("MemTotal") or 0) or (
                os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
            cpus = float(info.get("NCPU") or 0) or float(os.cpu_count() or 1)
            self._host = (memory, cpus)
        return self._host

    def resource_limits(self, lease: RunnerLease | Mapping) -> Limits:
        """The container limits of `lease`: `policy.limits` for its GPU count on a node of
        `node_gpus` GPUs and this engine's memory and CPUs (limits.py states the rule)."""
        memory, cpus = self.host_resources()
        return self.policy.limits(len(RunnerLease.of(lease).gpu_uuids) or 1, self.node_gpus,
                                  memory, cpus)

    def stop(self, lease_id: int, grace_s: float = 10) -> None:
        """Stop (SIGTERM, SIGKILL after grace_s) and remove the lease's container(s), then
        its authorized_keys file and its own network (per-lease)."""
        for container in self._containers(lease_id):
            try:
                container.stop(timeout=max(0, int(grace_s)))
                container.remove(force=True)
            except self._docker.errors.NotFound:
                pass
        self._cleanup(lease_id)

    def list_leases(self) -> dict[int, str]:
        """{lease id: container id} for every container of this node, running or exited."""
        out = {}
        for container in self._containers():
            try:
                out[int(container.labels[LEASE_LABEL])] = container.id
            except (KeyError, ValueError):
                continue  # a label someone else set by hand; not ours
        return out

    def describe(self) -> list[dict]:
        """For `status`: one dict per lease container of this node — lease (int), handle
        (container id), name, state ("running", "exited", …), gpus (NVIDIA_VISIBLE_DEVICES)."""
        out = []
        for container in self._containers():
            try:
                lease_id = int(container.labels[LEASE_LABEL])
            except (KeyError, ValueError):
                continue
            env = dict(item.split("=", 1) for item in
                       (container.attrs.get("Config", {}).get("Env") or []) if "=" in item)
            out.append({"lease": lease_id, "handle": container.id, "name": container.name,
                        "state": container.status,
                        "gpus": env.get("NVIDIA_VISIBLE_DEVICES", "")})
        return sorted(out, key=lambda d: d["lease"])

    def exit_status(self, lease_id: int) -> int | None:
        """None while the container runs (or is created/restarting), else its exit code.

        Raises RuntimeFailure when the lease has no container.
        """
        found = self._containers(lease_id)
        if not found:
            raise RuntimeFailure(f"lease {lease_id} has no container")
        state = found[0].attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None


    def logs(self, lease_id: int, lines: int = 200) -> str:
        """The last `lines` lines of the container's stdout and stderr ("" if none)."""
        found = self._containers(lease_id)
        if not found:
            raise RuntimeFailure(f"lease {lease_id} has no container")
        try:
            raw = found[0].logs(stdout=True, stderr=True, tail=max(1, int(lines)))
        except self._docker.errors.DockerException as exc:
            raise RuntimeFailure(f"cannot read the logs of lease {lease_id}: {exc}") from None
        return raw.decode("utf-8", "replace")

    def verify_gpus(self, lease: RunnerLease | Mapping) -> str | None:
        """Check from inside the running container that it sees exactly the leased GPUs.

        Real GPUs: `nvidia-smi -L` in the container (the NVIDIA container toolkit mounts
        it), UUIDs compared with the lease's (MIG UUIDs when the lease is of MIG slices).
        Simulate: no device is passed, so the container lists NVIDIA_VISIBLE_DEVICES in the
        shape of `nvidia-smi -L` (SIMULATED_LIST) and the same comparison runs.
        Returns None when they match or when the check cannot run (the container already
        exited, or lacks the tool; `last_check` then says why, for the log); otherwise the
        evidence, e.g. "container sees GPU-a,GPU-b; leased GPU-a (`nvidia-smi -L`)".
        """
        lease = RunnerLease.of(lease)
        leased = sorted(lease.gpu_uuids)
        self.last_check = "not run"
        found = self._containers(lease.id)
        if not found:
            return None
        command = SIMULATED_LIST if self.simulate else ["nvidia-smi", "-L"]
        shown = "nvidia-smi -L (simulated)" if self.simulate else "nvidia-smi -L"
        try:
            code, out = found[0].exec_run(command, stdout=True, stderr=True)
        except self._docker.errors.DockerException as exc:  # e.g. 409: not running
            self.last_check = f"`{shown}` could not run: {exc.__class__.__name__}"
            return None
        text = (out or b"").decode("utf-8", "replace")
        if code != 0:
            self.last_check = f"`{shown}` exited with status {code}"
            return None
        seen = listed_uuids(text, leased)
        self.last_check = f"`{shown}` sees {','.join(seen) or 'no GPU'}"
        if seen == leased:
            return None
        return (f"container sees {','.join(seen) or 'no GPU'}; "
                f"leased {','.join(leased) or 'no GPU'} (`{shown}`)")


#: With --simulate no device reaches the container: it lists NVIDIA_VISIBLE_DEVICES in
#: the shape of `nvidia-smi -L` (a MIG device indented under a GPU line), so the check
#: below reads what a real container would print.
SIMULATED_LIST = ["sh", "-c", 'for u in $(echo "$NVIDIA_VISIBLE_DEVICES" | tr , " "); do '
                  'case "$u" in MIG-*) echo "  MIG Device: (UUID: $u)";; '
                  '*) echo "GPU: (UUID: $u)";; esac; done']


def listed_uuids(text: str, leased: list[str]) -> list[str]:
    """The devices `nvidia-smi -L` output `text` lists, sorted: the MIG devices when the
    lease is of MIG slices (the output also names their parent GPUs), else the GPUs."""
    uuids = re.findall(r"\(UUID: ((?:GPU|MIG)-[0-9A-Za-z-]+)\)", text)
    mig = bool(leased) and all(u.startswith("MIG-") for u in leased)
    return sorted(u for u in uuids if u.startswith("MIG-" if mig else "GPU-"))


def docker_host() -> str:
    """Where the docker SDK looks for the engine: $DOCKER_HOST or the default socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
