"""A recorded host (`--simulate PATH`) as an Inventory, refusing anything malformed.

The report is `nvidia-smi -q` text (its shape: nvsmi_tree) or `nvidia-smi -q -x` XML
(nvsmi_xml), told apart by a first '<'; `nvidia-smi -L` beside it names the MIG devices
(nvsmi_listing, nvsmi_mig) and `nvidia-smi nvlink -s` gives NVLinks. Which files are read
(dump_files), what is accepted and what is refused: docs/RUNNER.md, "Reading the GPUs".
Every refusal is a DumpError naming the file and the 1-based line. The dataclasses here
(GpuInfo, MigDevice, NvLinkInfo, Inventory) are what nvml.py fills on a real host too.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from .catalog import gpu_class_for
from .nvsmi_listing import ListedGpu, parse_list, parse_nvlink_status
from .nvsmi_mig import RawMig, mig_blocks, mig_contradictions
from .nvsmi_tree import (  # noqa: F401  (re-exported: gpu_processes, tests)
    _GPU_HEADER,
    BANNER,
    INDENT,
    DumpError,
    Node,
    _parse_tree,
    first_content_line,
)
from .nvsmi_xml import looks_like_xml, xml_tree

TIMES = "\u00d7"  # multiplication sign, as in "8 (times) NVIDIA H100 80GB HBM3"
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

    uuid: str  # "MIG-…" as NVML / nvidia-smi -L print it
    profile: str  # GPU instance profile, e.g. "1g.10gb" (no "1c." prefix)
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    sm_count: int | None
    index: int  # MIG device index within its GPU
    # the compute instance's profile when it uses part of its GPU instance ("1c.3g.71gb",
    # as -L prints it), "" when it covers the whole instance (runner/mig.py: offered)
    compute_profile: str = ""


@dataclass(frozen=True)
class NvLinkInfo:
    """One NVLink of a GPU: link number, whether it is up, the peer's PCI bus id."""

    link: int
    active: bool
    remote_pci_bus_id: str | None  # "00000000:53:00.0" form, None when unknown


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU.

    uuid: "GPU-566e6f65-…" (NVML UUID); product_name: e.g. "NVIDIA H100 80GB HBM3";
    memory_mib: total framebuffer in MiB; pci_bus_id: "00000000:53:00.0";
    mig_mode: "Enabled", "Disabled" or "N/A"; gpu_class: catalog slug, e.g. "h100-sxm-80gb";
    mig_devices: its MIG devices by index (empty unless MIG is Enabled and instances exist);
    nvlinks: its NVLinks by link number (empty when it has none or the source lacks them).
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

    source: "nvml" or "simulate:<file name>" (the `source` field of the inventory call);
    notes: what the source could not tell, one sentence each (e.g. MIG devices a `-q`
    report shows without the `-L` listing that names them), for `inventory` and `doctor`.
    """

    driver_version: str
    cuda_version: str
    gpus: list[GpuInfo]
    source: str = "nvml"
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: count, times sign, product (class) per model, then driver and CUDA, e.g.
        '8 \u00d7 NVIDIA H100 80GB HBM3 (h100-sxm-80gb), driver 535.183.01, CUDA 12.2'."""
        counts = Counter((g.product_name, g.gpu_class) for g in self.gpus)
        groups = ", ".join(f"{n} {TIMES} {name} ({cls})" for (name, cls), n in counts.items())
        return f"{groups or 'no GPUs'}, driver {self.driver_version}, CUDA {self.cuda_version}"



def report_tree(text: str, name: str = "<dump>") -> tuple[Node, list[tuple[int, str]]]:
    """(tree, syntax problems) of a report, text or XML form (detected: XML begins '<').

    DumpError at once for an empty file, a text report without the banner as its first
    non-blank line, or malformed XML."""
    if not text.strip():
        raise DumpError(name, 1, "empty file: not the output of `nvidia-smi -q`")
    if looks_like_xml(text):
        return xml_tree(text, name), []
    number, first = first_content_line(text)
    if first != BANNER:
        raise DumpError(
            name, number, f"missing the {BANNER!r} banner: not the output of `nvidia-smi -q`"
        )
    return _parse_tree(text)


_LINK_KEY = re.compile(r"^Link (\d+)$")
_BUS = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-9A-Fa-f])$")


def normal_bus_id(value: str | None) -> str | None:
    """A PCI bus id in the "00000000:53:00.0" form (domain 8 hex digits, upper case);
    None when `value` is not one."""
    match = _BUS.match((value or "").strip())
    if not match:
        return None
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{dev.upper()}.{fn.upper()}"


def _nvlinks(section: Node) -> tuple[NvLinkInfo, ...]:
    """An "NVLink" section of a GPU, if the report has one: "Link N" entries whose value
    (or "State"/"Status" child) is a speed or "Active" when up, with the peer's bus id in a
    child whose key names "Remote" and "PCI"/"Bus". Reports without the section: ()."""
    holder = next((c for c in section.children
                   if c.value is None and c.key.replace(" ", "").lower()
                   in ("nvlink", "nvlinks", "nvlinkinfo", "nvlinkstatus")), None)
    if holder is None:
        return ()
    links = []
    for child in holder.children:
        match = _LINK_KEY.match(child.key)
        if not match:
            continue
        state = (child.known_at("State") or child.known_at("Status") or child.value or "")
        state = state.strip().strip("<>").lower()
        active = bool(state) and state not in ("inactive", "down", "disabled", "n/a",
                                               "not active")
        remote = next((c.value for c in child.children if "remote" in c.key.lower()
                       and ("pci" in c.key.lower() or "bus" in c.key.lower())), None)
        links.append(NvLinkInfo(int(match.group(1)), active, normal_bus_id(remote)))
    return tuple(sorted(links, key=lambda link: link.link))


def _gpu(section: Node, sections: list[Node], announced: int,
         problems: list[tuple[int, str]]) -> tuple[GpuInfo, list[RawMig]] | None:
    """One GPU section as a GpuInfo (gpu_class "", no MIG devices yet) and its MIG blocks;
    None (with a problem noted) when required fields are missing or wrong."""
    missing = [" / ".join(p) for p in REQUIRED_FIELDS if not section.known_at(*p)]
    if missing:
        short = section is sections[-1] and len(sections) < announced
        ends = " (the report ends inside it)" if short else ""
        problems.append((section.line, f"section {section.key!r} lacks {', '.join(missing)}"
                                       f"{ends}"))
        return None
    bus_id = section.value_at("PCI", "Bus Id")
    if bus_id.lower() != _GPU_HEADER.match(section.key).group(1).lower():
        problems.append((section.find("PCI", "Bus Id").line,
                         f"Bus Id {bus_id} differs from {section.key}"))
    total = section.find("FB Memory Usage", "Total")
    match = re.fullmatch(r"(\d+) MiB", total.value.strip())
    if not match:
        problems.append((total.line, f"FB Memory Usage / Total is {total.value!r}, not 'N MiB'"))
        return None
    gpu = GpuInfo(uuid=section.value_at("GPU UUID").strip(),
                  product_name=section.value_at("Product Name").strip(),
                  memory_mib=int(match.group(1)), pci_bus_id=bus_id.strip(),
                  mig_mode=section.known_at("MIG Mode", "Current") or "N/A", gpu_class="",
                  nvlinks=_nvlinks(section))
    return gpu, mig_blocks(section, problems)


def _listing_entries(gpus: list[tuple[GpuInfo, list[RawMig]]], listed: list[ListedGpu],
                     name: str, list_name: str, partial: bool) -> list[ListedGpu]:
    """The `-L` entry of each GPU of the report: by UUID when the listing's are distinct
    (a report of selected GPUs, `-q -i N`, may show fewer), else by position."""
    by_uuid = {entry.uuid: entry for entry in listed}
    if len(by_uuid) == len(listed) and (partial or len(listed) == len(gpus)):
        missing = [gpu.uuid for gpu, _ in gpus if gpu.uuid not in by_uuid]
        if missing:
            raise DumpError(list_name, listed[0].line, f"lists no GPU {missing[0]}, which "
                            f"{name} shows")
        return [by_uuid[gpu.uuid] for gpu, _ in gpus]
    if len(listed) != len(gpus):
        raise DumpError(list_name, listed[0].line,
                        f"lists {len(listed)} GPU(s) but {name} has {len(gpus)}")
    for position, ((gpu, _), entry) in enumerate(zip(gpus, listed, strict=True)):
        if entry.uuid != gpu.uuid:
            raise DumpError(list_name, entry.line, f"GPU {entry.index} is {entry.uuid} but GPU "
                            f"{position} of {name} is {gpu.uuid}")
    return listed


def _name_migs(gpus: list[tuple[GpuInfo, list[RawMig]]], listed: list[ListedGpu] | None,
               name: str, list_name: str, partial: bool) -> tuple[list[GpuInfo], list[str]]:
    """GpuInfos with their MIG devices named (UUID, profile) by the report or the `-L`
    listing; notes for MIG devices neither names. DumpError where they disagree (a MIG
    UUID twice, one GPU instance with two profiles, other MIG devices than the report's)."""
    entries = _listing_entries(gpus, listed, name, list_name, partial) if listed else None
    out, notes = [], []
    seen_uuids: dict[str, str] = {}
    for position, (gpu, raws) in enumerate(gpus):
        entry = entries[position] if entries is not None else None
        by_index = {m.index: m for m in entry.migs} if entry is not None else {}
        if entry is not None and set(by_index) != {r.index for r in raws}:
            raise DumpError(list_name, entry.line, f"GPU {entry.index} lists MIG device(s) "
                            f"{sorted(by_index)} but {name} shows {sorted(r.index for r in raws)}")
        migs, profiles = [], {}
        for raw in raws:
            named = by_index.get(raw.index)
            where, line = (list_name, named.line) if named else (name, raw.line)
            if named is not None and raw.uuid and raw.uuid != named.uuid:
                raise DumpError(where, line, f"MIG device {raw.index} is {named.uuid} but "
                                f"{name} line {raw.line} says {raw.uuid}")
            uuid = raw.uuid or (named.uuid if named else "")
            profile = raw.profile or (named.profile if named else "")
            label = f"GPU {gpu.pci_bus_id} device {raw.index}"
            if uuid and uuid in seen_uuids:
                raise DumpError(where, line, f"MIG UUID {uuid} is given to two MIG devices "
                                f"({seen_uuids[uuid]} and {label})")
            seen_uuids[uuid] = label
            known = profiles.setdefault(raw.gpu_instance_id, profile)
            if profile and known and known != profile:
                raise DumpError(where, line, f"GPU {gpu.pci_bus_id}: GPU instance "
                                f"{raw.gpu_instance_id} is both {known} and {profile}")
            compute = raw.compute_profile or (named.compute_profile if named else "")
            if uuid and profile:
                migs.append(MigDevice(uuid, profile, raw.gpu_instance_id,
                                      raw.compute_instance_id, raw.memory_mib, raw.sm_count,
                                      raw.index, covering(compute, profile)))
        if len(migs) == len(raws):
            out.append(replace(gpu, mig_devices=tuple(sorted(migs, key=lambda m: m.index))))
            continue
        notes.append(f"GPU {gpu.pci_bus_id}: {len(raws)} MIG device(s) left out: {name} "
                     "gives no UUID or profile for them (`nvidia-smi -q` prints neither); "
                     "record `nvidia-smi -L` next to it (docs/RUNNER.md, \"Reading the "
                     "GPUs\")")
        out.append(gpu)
    return out, notes


def covering(compute_profile: str, profile: str) -> str:
    """`compute_profile` ("1c.3g.71gb"), or "" when it is the whole GPU instance
    `profile` ("3c.3g.71gb" is all of 3g.71gb's compute slices)."""
    match = re.match(r"^(\d+)c\.(\d+)g\.", compute_profile)
    return "" if not match or match[1] == match[2] else compute_profile


def _with_nvlink_status(gpus: list[GpuInfo], text: str, list_name: str) -> list[GpuInfo]:
    """Links from `nvidia-smi nvlink -s` output for GPUs whose report has none (by UUID)."""
    listed = {g.uuid: g for g in parse_nvlink_status(text, list_name)}
    out = []
    for gpu in gpus:
        entry = listed.get(gpu.uuid)
        if entry is not None and not gpu.nvlinks:
            gpu = replace(gpu, nvlinks=tuple(NvLinkInfo(n, up, None)
                                             for n, (up, _text) in sorted(entry.links.items())))
        out.append(gpu)
    return out


def parse_text(text: str, name: str = "<dump>", *, listing: tuple[str, str] | None = None,
               nvlink: tuple[str, str] | None = None, classify: bool = True) -> Inventory:
    """Parse a report (`nvidia-smi -q` text or `-q -x` XML); `name`: the file name used in
    errors and `source`. listing: (text, file name) of `nvidia-smi -L` (names MIG devices);
    nvlink: (text, file name) of `nvidia-smi nvlink -s`. classify=False leaves gpu_class ""
    (reading a report of a model the catalog lacks).

    Returns an Inventory (source "simulate:<name>"). Raises DumpError (file and line named)
    for any malformed, incomplete or self-contradicting report, and
    catalog.UnknownGpuProduct (classify=True) for a model the marketplace has no class for.
    """
    root, syntax = report_tree(text, name)
    last = max(len(text.splitlines()), 1)
    problems: list[tuple[int, str]] = []  # missing or inconsistent content

    def header(key: str) -> Node:
        node = root.find(key)
        if node is None or not node.value:
            raise DumpError(name, 1, f"header field {key!r} is missing", syntax)
        return node

    driver, cuda, attached = header("Driver Version"), header("CUDA Version"), \
        header("Attached GPUs")
    if not attached.value.isdigit():
        raise DumpError(
            name, attached.line, f"'Attached GPUs' is {attached.value!r}, not a number", syntax
        )
    announced = int(attached.value)
    sections = [n for n in root.children if _GPU_HEADER.match(n.key) and n.value is None]
    pairs = [(s, g) for s in sections if (g := _gpu(s, sections, announced, problems))]
    read = [g for _s, g in pairs]
    notes = []
    if len(sections) < announced and (problems or not sections):
        problems.append((last, f"the report ends after {len(sections)} GPU section(s) but line "
                               f"{attached.line} announces 'Attached GPUs : {announced}' "
                               "(output cut short?)"))
    elif len(sections) < announced:  # `nvidia-smi -q -i N` prints the selected GPUs only
        notes.append(f"the report shows {len(sections)} of the {announced} attached GPUs "
                     "(recorded with `nvidia-smi -q -i …`?); only those are simulated")
    elif len(sections) > announced:
        problems.append((sections[announced].line,
                         f"GPU section {announced + 1} found but 'Attached GPUs' is {announced}"))
    seen: dict[str, int] = {}
    for section, (gpu, raws) in pairs:
        if gpu.uuid in seen:
            problems.append((section.line, f"GPU UUID {gpu.uuid} repeats line {seen[gpu.uuid]}"))
        seen[gpu.uuid] = section.line
        problems += mig_contradictions(gpu, raws)
    if syntax or problems:
        # Malformed lines first: they are the cause when content then looks missing.
        ordered = sorted(syntax) + sorted(problems)
        first_line, first = ordered[0]
        raise DumpError(name, first_line, first, ordered[1:])
    listed = parse_list(*listing) if listing else None
    gpus, mig_notes = _name_migs(read, listed, name, listing[1] if listing else "",
                                 partial=len(sections) < announced)
    notes += mig_notes
    if nvlink:
        gpus = _with_nvlink_status(gpus, *nvlink)
    if classify:
        gpus = [replace(g, gpu_class=gpu_class_for(g.product_name)) for g in gpus]
    return Inventory(driver.value, cuda.value, gpus, source=f"simulate:{name}",
                     notes=tuple(notes))


def read_text(path: str | Path) -> str:
    """Read a dump file; an unreadable file raises DumpError(path, 1, <OS reason>)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DumpError(str(path), 1, f"cannot read the file: {reason}") from None


_COMPANION = re.compile(r"^(?P<base>.+?)(\.q[^.]*)?\.(txt|xml)$")


@dataclass(frozen=True)
class DumpFiles:
    """The files of one recorded host: report (`-q` or `-q -x`), listing (`-L`, or None),
    nvlink (`nvlink -s`, or None)."""

    report: Path
    listing: Path | None = None
    nvlink: Path | None = None


def dump_files(path: str | Path) -> DumpFiles:
    """The files `--simulate PATH` reads. PATH is a report file, whose companions
    `<base>.L.txt` and `<base>.nvlink.txt` are used when they exist next to it (`<base>`:
    the name without `.txt`/`.xml` and a last `.q…` part: `host.q.txt`, `host.q-idle.txt`,
    `host.xml` → `host.L.txt`); or a directory holding one report (`*.txt`/`*.xml` other than
    the companions) and optionally its companions. DumpError when that is ambiguous."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file()
                       and p.suffix in (".txt", ".xml") and not p.name.endswith(
                           (".L.txt", ".nvlink.txt")))
        if len(files) != 1:
            raise DumpError(str(path), 1, f"the directory holds {len(files)} reports "
                            "(*.txt, *.xml other than *.L.txt, *.nvlink.txt); give one file")
        path = files[0]
    match = _COMPANION.match(path.name)
    base = match.group("base") if match else path.stem
    listing, nvlink = (path.with_name(f"{base}{end}") for end in (".L.txt", ".nvlink.txt"))
    return DumpFiles(path, listing if listing.is_file() and listing != path else None,
                     nvlink if nvlink.is_file() and nvlink != path else None)


def load_dump(path: str | Path, classify: bool = True) -> tuple[Inventory, Node]:
    """(inventory, report tree) of the recorded host at `path` (see dump_files)."""
    files = dump_files(path)
    text = read_text(files.report)
    listing = (read_text(files.listing), files.listing.name) if files.listing else None
    nvlink = (read_text(files.nvlink), files.nvlink.name) if files.nvlink else None
    inventory = parse_text(text, files.report.name, listing=listing, nvlink=nvlink,
                           classify=classify)
    return inventory, report_tree(text, files.report.name)[0]


def parse_dump(path: str | Path, classify: bool = True) -> Inventory:
    """The inventory of the recorded host at `path` (see dump_files, parse_text)."""
    return load_dump(path, classify)[0]
