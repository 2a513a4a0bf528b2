"""`nvidia-smi -L` and `nvidia-smi nvlink -s` output: what `-q` leaves out.

`nvidia-smi -q` prints MIG devices without their UUID or profile; `-L` prints both:

    GPU 0: NVIDIA H200 (UUID: GPU-…)
      MIG 1c.3g.71gb  Device  0: (UUID: MIG-…)       compute-instance profile "1c." prefix
      MIG 2g.35gb     Device  1: (UUID: MIG-…)

`nvidia-smi nvlink -s` prints the links of each GPU (indented by a tab), a speed when active:

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)
         Link 0: 26.562 GB/s
         Link 1: <inactive>

Both raise nvsmi_tree.DumpError (file, line) for a line of neither shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .nvsmi_tree import DumpError, first_content_line

_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)\s]+)\)$")
_MIG = re.compile(r"^MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)$")
_LINK = re.compile(r"^Link (\d+): (.+)$")
_CI_PREFIX = re.compile(r"^\d+c\.")


@dataclass(frozen=True)
class ListedMig:
    """A `-L` MIG line: device index, GPU instance profile ("3g.71gb"), MIG UUID, line, and
    the compute instance profile where `-L` prints one ("1c.3g.71gb")."""

    index: int
    profile: str
    uuid: str
    line: int
    compute_profile: str = ""  # "1c.3g.71gb" when a "Nc." prefix is printed, else ""


@dataclass(frozen=True)
class ListedGpu:
    """A `-L` / `nvlink -s` GPU line: index, product name, UUID, line; its MIG devices or
    its links ({link: (active, speed text)})."""

    index: int
    name: str
    uuid: str
    line: int
    migs: list[ListedMig] = field(default_factory=list)
    links: dict[int, tuple[bool, str]] = field(default_factory=dict)


def _gpus(text: str, name: str, child, empty_ok: bool = False) -> list[ListedGpu]:
    gpus: list[ListedGpu] = []
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _GPU.match(line)
        if match:
            gpus.append(ListedGpu(int(match[1]), match[2], match[3], number))
        elif gpus and raw[:1].isspace() and child(gpus[-1], line, number):
            continue
        else:
            raise DumpError(name, number, f"not a line of this listing: {line!r}")
    if not gpus and not (empty_ok and not text.strip()):
        raise DumpError(name, first_content_line(text)[0], "no 'GPU N: … (UUID: GPU-…)' line")
    return gpus


def parse_list(text: str, name: str = "<-L>") -> list[ListedGpu]:
    """The GPUs and MIG devices of `nvidia-smi -L` output; profile without its "1c." part
    (kept in compute_profile)."""

    def mig(gpu: ListedGpu, line: str, number: int) -> bool:
        match = _MIG.match(line)
        if match:
            profile = _CI_PREFIX.sub("", match[1])
            compute = match[1] if profile != match[1] else ""
            gpu.migs.append(ListedMig(int(match[2]), profile, match[3], number, compute))
        return bool(match)

    return _gpus(text, name, mig)


def parse_nvlink_status(text: str, name: str = "<nvlink -s>") -> list[ListedGpu]:
    """The GPUs of `nvidia-smi nvlink -s` output with links {n: (active, text)}; a link is
    active when it shows a speed, inactive for "<inactive>" (or "inactive", "down"). An
    empty output (a host without NVLink prints nothing) is no GPU; other indented lines
    are skipped."""

    def link(gpu: ListedGpu, line: str, number: int) -> bool:
        match = _LINK.match(line)
        if match:
            state = match[2].strip()
            down = state.strip("<>").lower() in ("inactive", "down", "disabled", "n/a")
            gpu.links[int(match[1])] = (not down, state)
        return True  # other lines under a GPU ("… all links are inActive") say no more

    return _gpus(text, name, link, empty_ok=True)
