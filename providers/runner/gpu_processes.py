"""Which processes hold a GPU: the check after a lease's container is removed.

A workload that outlives its container (a process that escaped the container's cgroup, a
hung CUDA context the driver has not torn down, or a host process someone started on a
leased GPU) would share the GPU with the next buyer. So after the runner stops and removes
a lease's workload it asks, per leased GPU UUID, which processes still hold it (agent.py,
`check_released`); a GPU that is not free gets a fatal `process_left` finding until it is.

Sources, one interface — `__call__(uuids) -> {uuid: [GpuProcess, …]}` (a GPU absent from
the answer could not be asked and is not judged):
- NvmlProcesses: NVML's nvmlDeviceGetComputeRunningProcesses and
  nvmlDeviceGetGraphicsRunningProcesses for the handle of each UUID (GPU or MIG device),
  names from nvmlSystemGetProcessName;
- DumpProcesses (`--simulate`): the "Processes" section of each GPU in the recorded
  `nvidia-smi -q` report ("Processes : None" when none), which tests may change with `set`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .nvsmi import _GPU_HEADER, _parse_tree, read_text


@dataclass(frozen=True)
class GpuProcess:
    """pid: the host's process id; name: its executable ("" when NVML cannot say); kind:
    "C" (compute), "G" (graphics) or "C+G"; used_mib: GPU memory in MiB (None: unknown)."""

    pid: int
    name: str = ""
    kind: str = "C"
    used_mib: int | None = None

    def describe(self) -> str:
        """'pid 1002127 /usr/bin/python (compute, 9212 MiB)'."""
        what = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}.get(self.kind,
                                                                                self.kind)
        memory = f", {self.used_mib} MiB" if self.used_mib is not None else ""
        name = f" {self.name}" if self.name else ""
        return f"pid {self.pid}{name} ({what}{memory})"


def describe_all(processes: list[GpuProcess], limit: int = 3) -> str:
    """The first `limit` processes described, '; '-joined, then 'and N more'."""
    text = "; ".join(p.describe() for p in processes[:limit])
    if len(processes) > limit:
        text += f"; and {len(processes) - limit} more"
    return text


def processes_from_text(text: str, name: str = "<dump>") -> dict[str, list[GpuProcess]]:
    """{GPU UUID: processes} from an `nvidia-smi -q` report: every GPU section's
    "Processes" (absent or "None": no process). Each process is a "Process ID : N" line with
    "Type", "Name" and "Used GPU Memory" (e.g. "9212 MiB") under it."""
    root, _ = _parse_tree(text)
    out: dict[str, list[GpuProcess]] = {}
    for section in (n for n in root.children if _GPU_HEADER.match(n.key)):
        uuid = section.value_at("GPU UUID")
        if not uuid:
            continue
        found: list[GpuProcess] = []
        block = section.find("Processes")
        for item in (block.children if block is not None else []):
            if item.key != "Process ID" or not (item.value or "").strip().isdigit():
                continue
            memory = (item.value_at("Used GPU Memory") or "").split()
            found.append(GpuProcess(
                pid=int(item.value), name=item.value_at("Name") or "",
                kind=item.value_at("Type") or "C",
                used_mib=int(memory[0]) if memory and memory[0].isdigit() else None))
        out[uuid] = found
    return out


class DumpProcesses:
    """The processes recorded in a `nvidia-smi -q` report (`--simulate FILE`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.table = processes_from_text(read_text(self.path), self.path.name)

    def set(self, uuid: str, processes: list[GpuProcess]) -> None:
        """Replace what the report says runs on `uuid` (tests: a process appears or exits)."""
        self.table[uuid] = list(processes)

    def __call__(self, uuids: list[str]) -> dict[str, list[GpuProcess]]:
        return {u: list(self.table[u]) for u in uuids if u in self.table}


class NvmlProcesses:
    """The processes NVML sees on each GPU. nv: the initialised pynvml module."""

    def __init__(self, nv) -> None:
        self.nv = nv

    def _name(self, pid: int) -> str:
        try:
            name = self.nv.nvmlSystemGetProcessName(pid)
        except self.nv.NVMLError:
            return ""
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def __call__(self, uuids: list[str]) -> dict[str, list[GpuProcess]]:
        nv = self.nv
        out: dict[str, list[GpuProcess]] = {}
        for uuid in uuids:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
                compute = nv.nvmlDeviceGetComputeRunningProcesses(handle)
                graphics = nv.nvmlDeviceGetGraphicsRunningProcesses(handle)
            except nv.NVMLError:
                continue  # cannot ask this GPU (lost, unsupported): not judged here
            seen: dict[int, GpuProcess] = {}
            for kind, items in (("C", compute), ("G", graphics)):
                for item in items or []:
                    pid = int(item.pid)
                    used = getattr(item, "usedGpuMemory", None)
                    used_mib = int(used) // 2**20 if isinstance(used, int) else None
                    if pid in seen:
                        old = seen[pid]
                        seen[pid] = GpuProcess(pid, old.name, "C+G",
                                               old.used_mib if used_mib is None else used_mib)
                    else:
                        seen[pid] = GpuProcess(pid, self._name(pid), kind, used_mib)
            out[uuid] = list(seen.values())
        return out


def source_for(gpus) -> DumpProcesses | NvmlProcesses | None:
    """The process source matching a GPU source: DumpProcesses for nvml.DumpGpus (its
    `path`), NvmlProcesses for nvml.NvmlGpus (its pynvml module); None for anything else."""
    if getattr(gpus, "simulate", False) and getattr(gpus, "path", None) is not None:
        return DumpProcesses(gpus.path)
    nv = getattr(gpus, "_nvml", None)
    return NvmlProcesses(nv) if nv is not None else None
