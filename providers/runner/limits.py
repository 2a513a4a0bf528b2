"""Resource limits of a lease's container: memory, CPUs, processes, /dev/shm.

The rule (ResourcePolicy.limits): a lease of g GPUs on a node of n GPUs gets g/n of the
host — g/n of its memory and g/n of its CPUs, as the Docker Engine reports them (`docker
info`: MemTotal, NCPU) — a limit of 4096 processes (pids), and a /dev/shm of half its memory
limit, at most 16 GiB. Swap is not added on top (memswap = memory). A provider overrides
each part by flag, environment or config file (cli.py): memory and CPUs per leased GPU,
the pids limit, and the shm size (per container, at most its memory limit).

So two 4-GPU leases on an 8-GPU host with 2 TiB and 224 CPUs get 1 TiB and 112 CPUs each
and never starve each other; a buyer who leases more GPUs gets more of the host with them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MiB = 2**20
GiB = 2**30
DEFAULT_PIDS_LIMIT = 4096
SHM_CAP = 16 * GiB
MIN_MEMORY = 64 * MiB  # below this no workload starts; Docker itself refuses < 6 MiB
MIN_CPUS = 0.01  # Docker's smallest --cpus

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'512m', '64g', '16GiB', '1.5t', '1048576' → bytes (binary units, as Docker reads them:
    k = KiB, m = MiB, g = GiB, t = TiB; 'b', 'kb', 'KiB' also accepted). Raises ValueError
    naming the value for anything else or for 0."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a size (e.g. 512m, 64g, 16GiB)")
        number = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not math.isfinite(number):
            raise ValueError(f"{text!r} is too large")
        value = int(number)
    if value <= 0:
        raise ValueError(f"{text!r} must be more than 0 bytes")
    return value


def format_size(value: int) -> str:
    """Bytes → '64 GiB', '512 MiB' (for the log)."""
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value} B"


@dataclass(frozen=True)
class Limits:
    """One container's limits. memory, shm_size: bytes; cpus: CPUs (fraction allowed);
    pids: processes and threads."""

    memory: int
    cpus: float
    pids: int
    shm_size: int

    def docker_kwargs(self) -> dict:
        """The Docker SDK's containers.run() keyword arguments for these limits."""
        return {"mem_limit": self.memory, "memswap_limit": self.memory,
                "nano_cpus": round(self.cpus * 1e9), "pids_limit": self.pids,
                "shm_size": self.shm_size}

    def describe(self) -> str:
        return (f"memory {format_size(self.memory)}, {self.cpus:g} CPUs, pids {self.pids}, "
                f"shm {format_size(self.shm_size)}")


@dataclass(frozen=True)
class ResourcePolicy:
    """The provider's choices; None means the default rule (module docstring).

    memory_per_gpu: bytes per leased GPU; cpus_per_gpu: CPUs per leased GPU; pids_limit:
    processes per container (> 0); shm_size: bytes of /dev/shm per container. Raises
    ValueError for a value that is not positive (or not finite).
    """

    memory_per_gpu: int | None = None
    cpus_per_gpu: float | None = None
    pids_limit: int = DEFAULT_PIDS_LIMIT
    shm_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("memory_per_gpu", "cpus_per_gpu", "shm_size"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number more than 0, not {value!r}")
        if int(self.pids_limit) <= 0:
            raise ValueError(f"pids_limit must be more than 0, not {self.pids_limit!r}")

    def limits(self, gpus: int, node_gpus: int | None, host_memory: int,
               host_cpus: float) -> Limits:
        """Limits for a lease of `gpus` GPUs on a node of `node_gpus` GPUs (None or less
        than `gpus`: the lease has the whole host) on a host with `host_memory` bytes and
        `host_cpus` CPUs. CPUs are capped at the host's (Docker refuses more); memory is
        at least 64 MiB, CPUs at least 0.01 (rounded down to hundredths)."""
        gpus = max(1, int(gpus))
        node_gpus = max(gpus, int(node_gpus or 0))
        if self.memory_per_gpu is not None:
            memory = self.memory_per_gpu * gpus
        else:
            memory = host_memory * gpus // node_gpus
        memory = max(MIN_MEMORY, memory // MiB * MiB)
        cpus = (self.cpus_per_gpu * gpus if self.cpus_per_gpu is not None
                else host_cpus * gpus / node_gpus)
        cpus = max(MIN_CPUS, math.floor(min(cpus, host_cpus) * 100) / 100)
        shm = min(memory // 2, SHM_CAP) if self.shm_size is None else min(self.shm_size, memory)
        return Limits(memory=memory, cpus=cpus, pids=int(self.pids_limit), shm_size=shm)
