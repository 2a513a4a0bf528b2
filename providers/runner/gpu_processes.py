"""Which processes hold a GPU: the check after a lease's container is removed.

Sources with one interface, `__call__(uuids) -> {uuid: [GpuProcess, …]}` (a GPU absent
from the answer could not be asked) and `live`: NvmlProcesses (NVML's compute and graphics
processes) and DumpProcesses (`--simulate`: the dump's "Processes" sections plus the
replayed leftovers of `--replay-process-left`). The baseline and leftover rule (gpu_guard.py
applies it): docs/RUNNER.md, "GPUs free after a lease".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .nvml import DumpGpus, NvmlGpus, ReplayError
from .nvsmi import _GPU_HEADER, dump_files, read_text, report_tree

KINDS = ("C", "G", "C+G")
NAME_MAX = 80  # characters of a process name shown in evidence


@dataclass(frozen=True)
class GpuProcess:
    """pid: the host's process id; name: its executable ("" when NVML cannot say); kind:
    "C" (compute), "G" (graphics) or "C+G"; used_mib: GPU memory in MiB (None: unknown)."""

    pid: int
    name: str = ""
    kind: str = "C"
    used_mib: int | None = None

    @property
    def key(self) -> tuple[int, str]:
        """(pid, name): what the baseline compares (memory use changes, the process not)."""
        return (self.pid, self.name)

    def describe(self) -> str:
        """'pid 1002127 /usr/bin/python (compute, 9212 MiB)'; a name longer than NAME_MAX
        characters is cut (evidence stays short: a celery worker's name can be 300)."""
        what = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}.get(self.kind,
                                                                                self.kind)
        memory = f", {self.used_mib} MiB" if self.used_mib is not None else ""
        short = self.name if len(self.name) <= NAME_MAX else self.name[:NAME_MAX - 1] + "…"
        name = f" {short}" if short else ""
        return f"pid {self.pid}{name} ({what}{memory})"


@runtime_checkable
class ProcessSource(Protocol):
    """Which processes hold which GPU (NvmlProcesses, DumpProcesses): `source(uuids)` →
    {uuid: processes}, a GPU absent from the answer could not be asked; live: whether lease
    workloads' processes show up in it (NVML yes, a dump no)."""

    live: bool

    def __call__(self, uuids: list[str]) -> dict[str, list[GpuProcess]]: ...


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
    root, _ = report_tree(text, name)
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
    """The processes recorded in a `nvidia-smi -q` report (`--simulate FILE`).

    left_after_lease: {uuid: [GpuProcess, …]} that appear on that GPU when the first lease
    workload on it is removed (`--replay-process-left`; workload_removed adds them);
    uuid_map: {recorded UUID: the one the runner uses} (nvml.DumpGpus.uuid_map)."""

    live = False  # the recorded processes ran on the recorded host, never in a lease here

    def __init__(self, path: str | Path,
                 left_after_lease: dict[str, list[GpuProcess]] | None = None,
                 uuid_map: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        report = dump_files(self.path).report
        self.table = {(uuid_map or {}).get(u, u): p for u, p in
                      processes_from_text(read_text(report), report.name).items()}
        self.pending = {u: list(p) for u, p in (left_after_lease or {}).items()}

    def set(self, uuid: str, processes: list[GpuProcess]) -> None:
        """Replace what the report says runs on `uuid` (tests: a process appears or exits)."""
        self.table[uuid] = list(processes)

    def workload_removed(self, uuids: list[str]) -> None:
        """A lease workload on `uuids` was just removed: the replayed leftovers of those GPUs
        appear now (once each)."""
        for uuid in uuids:
            for process in self.pending.pop(uuid, []):
                self.table[uuid] = [*self.table.get(uuid, []), process]

    def __call__(self, uuids: list[str]) -> dict[str, list[GpuProcess]]:
        return {u: list(self.table[u]) for u in uuids if u in self.table}


class NvmlProcesses:
    """The processes NVML sees on each GPU. nv: the initialised pynvml module."""

    live = True  # a lease workload's processes show up here (host pids)

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


def load_replay_process_left(value: str) -> dict[str, list[GpuProcess]]:
    """--replay-process-left: inline JSON, or the path of a JSON file, holding
    {"GPU-…": [{"pid": 4242, "name": "/opt/conda/bin/python", "type": "C",
    "used_mib": 1024}, …]} (pid required; name "", type "C", used_mib null by default).
    ReplayError naming the GPU and field of anything else."""
    flag = "--replay-process-left"
    text = value
    if not value.lstrip().startswith(("{", "[")):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as exc:
            raise ReplayError(f"{flag} {value}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReplayError(f"{flag} is not JSON: {exc}") from None
    shape = f'{flag} must be {{"GPU-…": [{{"pid": 4242, "name": "python"}}, …]}}'
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ReplayError(shape)
    out: dict[str, list[GpuProcess]] = {}
    for uuid, items in data.items():
        found = []
        for i, item in enumerate(items):
            where = f"{flag} {uuid}[{i}]"
            if not isinstance(item, dict):
                raise ReplayError(shape)
            unknown = sorted(set(item) - {"pid", "name", "type", "used_mib"})
            if unknown:
                raise ReplayError(f"{where}: unknown field(s) {', '.join(unknown)} (known: "
                                  "pid, name, type, used_mib)")
            pid, name = item.get("pid"), item.get("name", "")
            kind, used = item.get("type", "C"), item.get("used_mib")
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise ReplayError(f"{where}.pid: a process id (a whole number above 0)")
            if not isinstance(name, str):
                raise ReplayError(f"{where}.name: a string")
            if kind not in KINDS:
                raise ReplayError(f"{where}.type: one of {', '.join(KINDS)}")
            if used is not None and (not isinstance(used, int) or isinstance(used, bool)
                                     or used < 0):
                raise ReplayError(f"{where}.used_mib: MiB as a whole number, or null")
            found.append(GpuProcess(pid, name, kind, used))
        out[uuid] = found
    return out


def source_for(gpus) -> DumpProcesses | NvmlProcesses | None:
    """The process source matching a GPU source: DumpProcesses for nvml.DumpGpus (its
    `path` and `replay_process_left`), NvmlProcesses for nvml.NvmlGpus (its pynvml module);
    None for anything else."""
    if isinstance(gpus, DumpGpus):
        return DumpProcesses(gpus.path, gpus.replay_process_left, gpus.uuid_map)
    if isinstance(gpus, NvmlGpus):
        return NvmlProcesses(gpus._nvml)
    return None
