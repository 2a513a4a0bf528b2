"""Parse the text of `nvidia-smi -q` into an Inventory, refusing anything malformed.

Source: the human-readable report of `nvidia-smi -q` (NVIDIA driver ≥ 470). Its shape:

    ==============NVSMI LOG==============          banner, line 1
    Driver Version                            : 535.183.01
    CUDA Version                              : 12.2
    Attached GPUs                             : 8
    GPU 00000000:53:00.0                            one section per GPU, indent 0
        Product Name                          : NVIDIA H100 80GB HBM3
        FB Memory Usage                             nested section, 4 more spaces
            Total                             : 81559 MiB

Every line is blank, a section header (text without " : ") or `key : value`, indented by a
multiple of 4 spaces and at most 4 deeper than the line before it (a `key : value` line may
have children: "HW Slowdown : Not Active" lists "HW Thermal Slowdown" under it). nvidia-smi
pads every key so that " : " falls in one column for the whole report; a line whose " : "
sits elsewhere although its key would fit is a corrupted line. Any violation raises
DumpError naming the file and the 1-based line.

This module is used for `--simulate FILE`: a host without an NVIDIA driver pretends to have
the GPUs of a recorded report. On a real host the runner reads NVML instead (nvml.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import gpu_class_for

BANNER = "==============NVSMI LOG=============="
INDENT = 4
TIMES = "\u00d7"  # multiplication sign, as in "8 (times) NVIDIA H100 80GB HBM3"
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")
_SEP = " : "
#: Required GPU fields, as paths of keys inside a GPU section.
REQUIRED_FIELDS: tuple[tuple[str, ...], ...] = (
    ("GPU UUID",),
    ("Product Name",),
    ("FB Memory Usage", "Total"),
    ("PCI", "Bus Id"),
)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance in a GPU instance) of a MIG-enabled GPU."""
    uuid: str                 # "MIG-…" as NVML / nvidia-smi -L print it
    profile: str              # GPU instance profile, e.g. "1g.10gb" (no "1c." prefix)
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    sm_count: int | None
    index: int                # MIG device index within its GPU


@dataclass(frozen=True)
class NvLinkInfo:
    link: int
    active: bool
    remote_pci_bus_id: str | None   # "00000000:53:00.0" form, None when unknown


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU.

    uuid: "GPU-566e6f65-…" (NVML UUID); product_name: e.g. "NVIDIA H100 80GB HBM3";
    memory_mib: total framebuffer in MiB; pci_bus_id: "00000000:53:00.0";
    mig_mode: "Enabled", "Disabled" or "N/A"; gpu_class: catalog slug, e.g. "h100-sxm-80gb".
    """

    uuid: str
    product_name: str
    memory_mib: int
    pci_bus_id: str
    mig_mode: str
    gpu_class: str
    mig_devices: tuple[MigDevice, ...] = ()
    nvlinks: tuple[NvLinkInfo, ...] = ()

    def as_protocol(self) -> dict:
        """The GPU as a `gpus[]` item of POST /api/v1/runner/inventory/."""
        return {
            "uuid": self.uuid,
            "product_name": self.product_name,
            "gpu_class": self.gpu_class,
            "memory_mib": self.memory_mib,
            "pci_bus_id": self.pci_bus_id,
            "mig_mode": self.mig_mode,
        }


@dataclass(frozen=True)
class Inventory:
    """The GPUs of a host: driver_version "535.183.01", cuda_version "12.2", gpus in bus order.

    source: "nvml" or "simulate:<file name>" (the `source` field of the inventory call).
    """

    driver_version: str
    cuda_version: str
    gpus: list[GpuInfo]
    source: str = "nvml"

    def summary(self) -> str:
        """One line: count, times sign, product (class) per model, then driver and CUDA, e.g.
        '8 \u00d7 NVIDIA H100 80GB HBM3 (h100-sxm-80gb), driver 535.183.01, CUDA 12.2'."""
        counts = Counter((g.product_name, g.gpu_class) for g in self.gpus)
        groups = ", ".join(f"{n} {TIMES} {name} ({cls})" for (name, cls), n in counts.items())
        return f"{groups or 'no GPUs'}, driver {self.driver_version}, CUDA {self.cuda_version}"


class DumpError(ValueError):
    """A `nvidia-smi -q` report that cannot be trusted.

    path: the file name shown; line: 1-based line of the first problem; reason: what is wrong.
    str() is one line: "<path>:<line>: <reason>" (plus "; also line N: …" for other problems).
    """

    def __init__(self, path: str, line: int, reason: str, more: list[tuple[int, str]] = ()):
        self.path, self.line, self.reason = path, line, reason
        self.more = list(more)
        msg = f"{path}:{line}: {reason}"
        for other_line, other in self.more[:3]:
            msg += f"; also line {other_line}: {other}"
        if len(self.more) > 3:
            msg += f"; and {len(self.more) - 3} more problem(s)"
        super().__init__(msg)


@dataclass
class Node:
    """One line of the report: key, value (None for a section header), 1-based line, children."""

    key: str
    value: str | None
    line: int
    children: list[Node] = field(default_factory=list)

    def find(self, *path: str) -> Node | None:
        """The first descendant reached by following `path` keys, or None."""
        node: Node | None = self
        for key in path:
            node = next((c for c in node.children if c.key == key), None)
            if node is None:
                return None
        return node

    def value_at(self, *path: str) -> str | None:
        """The value of the node at `path`, or None when absent or a section header."""
        node = self.find(*path)
        return None if node is None else node.value


def _parse_tree(text: str) -> tuple[Node, list[tuple[int, str]]]:
    """Build the indentation tree; return (root, problems) with problems as (line, reason)."""
    root = Node("", None, 0)
    problems: list[tuple[int, str]] = []
    lines = text.splitlines()
    # The column where " : " sits in (nearly) every line: nvidia-smi pads keys to it.
    seps = Counter(ln.find(_SEP) for ln in lines if _SEP in ln)
    sep_col = seps.most_common(1)[0][0] if seps else -1
    stack: list[tuple[int, Node]] = [(-INDENT, root)]  # (indent, node)
    prev_indent = -INDENT  # indent of the last non-blank line; its children may go 4 deeper
    misaligned: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if number == 1 and raw.strip() == BANNER:
            continue
        if "\t" in raw:
            problems.append((number, "tab character; nvidia-smi indents with spaces only"))
            continue
        line = raw.rstrip()
        indent = len(line) - len(line.lstrip(" "))
        body = line[indent:]
        if indent % INDENT:
            problems.append((number, f"indented {indent} spaces, not a multiple of {INDENT}"))
            continue
        if indent > prev_indent + INDENT:
            problems.append(
                (number, f"indented {indent} spaces, more than {INDENT} deeper than the line above")
            )
            continue
        if _SEP in line:
            pos = line.find(_SEP)
            key, value = line[indent:pos].strip(), line[pos + len(_SEP) :].strip()
            if not key:
                problems.append((number, f"'key : value' line with an empty key: {body!r}"))
                continue
            expected = max(sep_col, indent + len(key))
            if pos != expected:
                misaligned.append(number)
        elif body.endswith(" :"):  # "key :" with an empty value
            key, value = body[:-2].strip(), ""
        elif ":" in body and not (indent == 0 and _GPU_HEADER.match(body)):
            problems.append((number, f"not 'key : value' nor a section header: {body!r}"))
            continue
        else:
            key, value = body, None
        while stack[-1][0] >= indent:
            stack.pop()
        node = Node(key, value, number)
        stack[-1][1].children.append(node)
        stack.append((indent, node))
        prev_indent = indent
    # Report runs of misaligned lines as one problem each.
    start = None
    for i, number in enumerate(misaligned):
        if start is None:
            start = number
        if i + 1 == len(misaligned) or misaligned[i + 1] != number + 1:
            where = f"lines {start}-{number}" if number != start else f"line {start}"
            problems.append(
                (
                    start,
                    f"corrupted {where}: ' : ' is not in column {sep_col + 2} where every "
                    "other line of the report puts it",
                )
            )
            start = None
    problems.sort(key=lambda p: p[0])
    return root, problems


def parse_text(text: str, name: str = "<dump>") -> Inventory:
    """Parse the text of `nvidia-smi -q`; `name` is the file name used in errors and `source`.

    Returns an Inventory (source "simulate:<name>"). Raises DumpError (file and line named)
    for any malformed or incomplete report, and catalog.UnknownGpuProduct for a GPU model
    the marketplace has no class for.
    """
    lines = text.splitlines()
    last = max(len(lines), 1)
    if not text.strip():
        raise DumpError(name, 1, "empty file: not the output of `nvidia-smi -q`")
    if lines[0].strip() != BANNER:
        raise DumpError(
            name, 1, f"missing the {BANNER!r} banner: not the output of `nvidia-smi -q`"
        )
    root, syntax = _parse_tree(text)
    problems: list[tuple[int, str]] = []  # missing or inconsistent content

    def header(key: str) -> Node:
        node = root.find(key)
        if node is None or not node.value:
            raise DumpError(name, 1, f"header field {key!r} is missing", syntax)
        return node

    driver = header("Driver Version")
    cuda = header("CUDA Version")
    attached = header("Attached GPUs")
    if not attached.value.isdigit():
        raise DumpError(
            name, attached.line, f"'Attached GPUs' is {attached.value!r}, not a number", syntax
        )
    announced = int(attached.value)
    gpus: list[GpuInfo] = []
    sections = [n for n in root.children if _GPU_HEADER.match(n.key)]
    for section in sections:
        missing = [" / ".join(p) for p in REQUIRED_FIELDS if not section.value_at(*p)]
        if missing:
            short = section is sections[-1] and len(sections) < announced
            ends = " (the report ends inside it)" if short else ""
            problems.append(
                (
                    section.line,
                    f"section {section.key!r} lacks {', '.join(missing)}{ends}",
                )
            )
            continue
        bus_id = section.value_at("PCI", "Bus Id")
        if bus_id.lower() != _GPU_HEADER.match(section.key).group(1).lower():
            problems.append(
                (section.find("PCI", "Bus Id").line, f"Bus Id {bus_id} differs from {section.key}")
            )
        total = section.find("FB Memory Usage", "Total")
        match = re.fullmatch(r"(\d+) MiB", total.value)
        if not match:
            problems.append(
                (total.line, f"FB Memory Usage / Total is {total.value!r}, not 'N MiB'")
            )
            continue
        gpus.append(
            GpuInfo(
                uuid=section.value_at("GPU UUID"),
                product_name=section.value_at("Product Name"),
                memory_mib=int(match.group(1)),
                pci_bus_id=bus_id,
                mig_mode=section.value_at("MIG Mode", "Current") or "N/A",
                gpu_class="",
            )
        )
    if len(sections) < announced:
        problems.append(
            (
                last,
                f"the report ends after {len(sections)} GPU section(s) but line {attached.line} "
                f"announces 'Attached GPUs : {announced}' (output cut short?)",
            )
        )
    elif len(sections) > announced:
        problems.append(
            (
                sections[announced].line,
                f"GPU section {announced + 1} found but 'Attached GPUs' is {announced}",
            )
        )
    seen: dict[str, int] = {}
    for section, gpu in zip(sections, gpus, strict=False):
        if gpu.uuid in seen:
            problems.append((section.line, f"GPU UUID {gpu.uuid} repeats line {seen[gpu.uuid]}"))
        seen[gpu.uuid] = section.line
    if syntax or problems:
        # Malformed lines first: they are the cause when content then looks missing.
        ordered = sorted(syntax) + sorted(problems)
        first_line, first = ordered[0]
        raise DumpError(name, first_line, first, ordered[1:])
    gpus = [
        GpuInfo(g.uuid, g.product_name, g.memory_mib, g.pci_bus_id, g.mig_mode,
                gpu_class_for(g.product_name))
        for g in gpus
    ]
    return Inventory(driver.value, cuda.value, gpus, source=f"simulate:{name}")


def read_text(path: str | Path) -> str:
    """Read a dump file; an unreadable file raises DumpError(path, 1, <OS reason>)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DumpError(str(path), 1, f"cannot read the file: {reason}") from None


def parse_dump(path: str | Path) -> Inventory:
    """Parse the `nvidia-smi -q` report in file `path` (see parse_text for errors)."""
    return parse_text(read_text(path), name=Path(path).name)


def _number(value: str | None) -> float | None:
    match = re.match(r"^-?\d+(\.\d+)?", value or "")
    return float(match.group(0)) if match else None


def _yes(value: str | None) -> bool | None:
    """"Yes"/"Active" → True, "No"/"Not Active" → False, anything else (N/A) → None."""
    text = (value or "").strip().lower()
    if text in ("yes", "active"):
        return True
    if text in ("no", "not active"):
        return False
    return None


def _int(value: str | None) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _slowdown_temp(section: Node, temp: float | None) -> int | None:
    """The GPU's HW slowdown temperature in °C: "GPU Slowdown Temp" when the report gives it
    absolutely; in T.Limit mode (Hopper, Ada on driver ≥ 530) the report gives the margin
    to T.Limit ("GPU T.Limit Temp", positive = below T.Limit) and the slowdown point as a
    margin ("GPU Slowdown T.Limit Temp", e.g. -2 C); slowdown starts when the margin falls
    to that value, i.e. at current + margin − slowdown margin °C."""
    absolute = _number(section.value_at("Temperature", "GPU Slowdown Temp"))
    if absolute is not None:
        return int(absolute)
    margin = _number(section.value_at("Temperature", "GPU T.Limit Temp"))
    slowdown_margin = _number(section.value_at("Temperature", "GPU Slowdown T.Limit Temp"))
    if temp is None or margin is None or slowdown_margin is None:
        return None
    return int(temp + margin - slowdown_margin)


def health_from_text(text: str, name: str = "<dump>") -> dict[str, dict]:
    """Health readings recorded in a report, by GPU UUID (the keys of health.py's readings).

    Each value: {"temperature_c": int|None ("Temperature / GPU Current Temp", °C),
    "power_w": float|None ("GPU Power Readings" or "Power Readings" / "Power Draw", W),
    "utilization_pct": int|None ("Utilization / Gpu", %),
    "ecc_uncorrectable": int|None (sum of "ECC Errors / Volatile / *Uncorrectable*"),
    "slowdown_temp_c": int|None (see _slowdown_temp),
    "retired_pages": int|None (sum of "Retired Pages / Single Bit ECC, Double Bit ECC"),
    "retired_pages_pending": bool|None ("Retired Pages / Pending Page Blacklist"),
    "remapped_rows_pending", "remapping_failure": bool|None ("Remapped Rows / Pending",
    "… / Remapping Failure Occurred"), "hw_thermal_slowdown", "hw_power_brake": bool|None
    ("Clocks Event Reasons" (or "Clocks Throttle Reasons") / "HW Slowdown" / "HW Thermal
    Slowdown", "HW Power Brake Slowdown"), "pcie_gen_current", "pcie_gen_max",
    "pcie_width_current", "pcie_width_max": int|None ("PCI / GPU Link Info"),
    "lost": False}.
    None where the report says N/A. Raises DumpError like parse_text.
    """
    parse_text(text, name)  # refuse what parse_text refuses
    root, _ = _parse_tree(text)
    out: dict[str, dict] = {}
    for section in (n for n in root.children if _GPU_HEADER.match(n.key)):
        temp = _number(section.value_at("Temperature", "GPU Current Temp"))
        power = _number(
            section.value_at("GPU Power Readings", "Power Draw")
            or section.value_at("Power Readings", "Power Draw")
        )
        util = _number(section.value_at("Utilization", "Gpu"))
        volatile = section.find("ECC Errors", "Volatile")
        ecc = None
        if volatile is not None:
            counts = [_number(c.value) for c in volatile.children if "Uncorrectable" in c.key]
            counts = [c for c in counts if c is not None]
            ecc = int(sum(counts)) if counts else None
        retired = [_int(section.value_at("Retired Pages", k))
                   for k in ("Single Bit ECC", "Double Bit ECC")]
        retired = [c for c in retired if c is not None]
        reasons = section.find("Clocks Event Reasons") or section.find("Clocks Throttle Reasons")
        hw = reasons.find("HW Slowdown") if reasons is not None else None
        link = ("PCI", "GPU Link Info")
        out[section.value_at("GPU UUID")] = {
            "temperature_c": None if temp is None else int(temp),
            "power_w": power,
            "utilization_pct": None if util is None else int(util),
            "ecc_uncorrectable": ecc,
            "slowdown_temp_c": _slowdown_temp(section, temp),
            "retired_pages": sum(retired) if retired else None,
            "retired_pages_pending": _yes(section.value_at("Retired Pages",
                                                           "Pending Page Blacklist")),
            "remapped_rows_pending": _yes(section.value_at("Remapped Rows", "Pending")),
            "remapping_failure": _yes(section.value_at("Remapped Rows",
                                                       "Remapping Failure Occurred")),
            "hw_thermal_slowdown": _yes(hw.value_at("HW Thermal Slowdown")) if hw else None,
            "hw_power_brake": _yes(hw.value_at("HW Power Brake Slowdown")) if hw else None,
            "pcie_gen_current": _int(section.value_at(*link, "PCIe Generation", "Current")),
            "pcie_gen_max": _int(section.value_at(*link, "PCIe Generation", "Max")),
            "pcie_width_current": _int(section.value_at(*link, "Link Width", "Current")),
            "pcie_width_max": _int(section.value_at(*link, "Link Width", "Max")),
            "lost": False,
        }
    return out
