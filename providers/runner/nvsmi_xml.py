"""The XML form of the report (`nvidia-smi -q -x`) as the same Node tree as the text form.

Parsed with the standard library's expat (xml.parsers.expat, under xml.etree.ElementTree)
so that every node keeps its line. Real reports begin with
`<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">`: a DOCTYPE naming an external
DTD is accepted (expat never fetches it); an internal subset, any entity declaration or an
entity reference other than the five predefined ones is refused (DumpError), so no
"billion laughs" or external entity can be expanded.

The elements the runner reads are renamed (XML_KEYS; uncorrectable volatile ECC counters
by rule) to the text form's keys (XML_KEYS), so one
reader serves both forms; the others keep their tag as key. `mig_devices/mig_device`
become "MIG Device" sections of the GPU, `processes/process_info` become
"Processes / Process ID" like the text form's.
"""

from __future__ import annotations

from xml.parsers import expat

from .nvsmi_tree import DumpError, Node

_LINK = ("pci", "pci_gpu_link_info")
_TLINK = ("PCI", "GPU Link Info")
#: XML path inside <gpu> → key path of the text form (nvsmi_tree).
XML_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("product_name",): ("Product Name",),
    ("uuid",): ("GPU UUID",),
    ("fb_memory_usage", "total"): ("FB Memory Usage", "Total"),
    ("fb_memory_usage", "used"): ("FB Memory Usage", "Used"),
    ("fb_memory_usage", "free"): ("FB Memory Usage", "Free"),
    ("clocks", "sm_clock"): ("Clocks", "SM"),
    ("clocks", "mem_clock"): ("Clocks", "Memory"),
    ("pci", "pci_bus_id"): ("PCI", "Bus Id"),
    (*_LINK, "pcie_gen", "max_link_gen"): (*_TLINK, "PCIe Generation", "Max"),
    (*_LINK, "pcie_gen", "current_link_gen"): (*_TLINK, "PCIe Generation", "Current"),
    (*_LINK, "link_widths", "max_link_width"): (*_TLINK, "Link Width", "Max"),
    (*_LINK, "link_widths", "current_link_width"): (*_TLINK, "Link Width", "Current"),
    ("mig_mode", "current_mig"): ("MIG Mode", "Current"),
    ("mig_mode", "pending_mig"): ("MIG Mode", "Pending"),
    ("temperature", "gpu_temp"): ("Temperature", "GPU Current Temp"),
    ("temperature", "gpu_temp_slow_threshold"): ("Temperature", "GPU Slowdown Temp"),
    ("temperature", "gpu_temp_tlimit"): ("Temperature", "GPU T.Limit Temp"),
    ("temperature", "gpu_temp_slow_tlimit_threshold"):
        ("Temperature", "GPU Slowdown T.Limit Temp"),
    ("power_readings", "power_draw"): ("Power Readings", "Power Draw"),
    ("gpu_power_readings", "power_draw"): ("GPU Power Readings", "Power Draw"),
    ("gpu_power_readings", "instant_power_draw"):
        ("GPU Power Readings", "Instantaneous Power Draw"),
    ("gpu_power_readings", "average_power_draw"): ("GPU Power Readings", "Average Power Draw"),
    ("utilization", "gpu_util"): ("Utilization", "Gpu"),
    ("retired_pages", "multiple_single_bit_retirement", "retired_count"):
        ("Retired Pages", "Single Bit ECC"),
    ("retired_pages", "double_bit_retirement", "retired_count"):
        ("Retired Pages", "Double Bit ECC"),
    ("retired_pages", "pending_blacklist"): ("Retired Pages", "Pending Page Blacklist"),
    ("remapped_rows", "remapped_row_pending"): ("Remapped Rows", "Pending"),
    ("remapped_rows", "remapped_row_failure"): ("Remapped Rows", "Remapping Failure Occurred"),
}
for _kind, _title in (("event", "Clocks Event Reasons"), ("throttle", "Clocks Throttle Reasons")):
    _tag = f"clocks_{_kind}_reason"
    XML_KEYS[(f"{_tag}s", f"{_tag}_hw_slowdown")] = (_title, "HW Slowdown")
    XML_KEYS[(f"{_tag}s", f"{_tag}_hw_thermal_slowdown")] = (
        _title, "HW Slowdown", "HW Thermal Slowdown")
    XML_KEYS[(f"{_tag}s", f"{_tag}_hw_power_brake_slowdown")] = (
        _title, "HW Slowdown", "HW Power Brake Slowdown")
#: XML path inside <mig_device> → key path of a text "MIG Device" block.
MIG_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("index",): ("Index",),
    ("uuid",): ("UUID",),
    ("gpu_instance_id",): ("GPU Instance ID",),
    ("compute_instance_id",): ("Compute Instance ID",),
    ("device_attributes", "shared", "multiprocessor_count"):
        ("Device Attributes", "Shared", "Multiprocessor count"),
    ("fb_memory_usage", "total"): ("Shared FB Memory Usage", "Total"),
}
PROCESS_KEYS = {("type",): ("Type",), ("process_name",): ("Name",),
                ("used_memory",): ("Used GPU Memory",)}
HEADER_KEYS = {"driver_version": "Driver Version", "cuda_version": "CUDA Version",
               "attached_gpus": "Attached GPUs", "timestamp": "Timestamp"}


class _Element:
    __slots__ = ("attrs", "children", "line", "tag", "text")

    def __init__(self, tag: str, attrs: dict, line: int) -> None:
        self.tag, self.attrs, self.line = tag, attrs, line
        self.text: list[str] = []
        self.children: list[_Element] = []

    @property
    def value(self) -> str:
        return "".join(self.text).strip()

    def leaves(self, prefix: tuple[str, ...] = ()):
        """(path, element) for every descendant element without children."""
        for child in self.children:
            path = (*prefix, child.tag)
            if child.children:
                yield from child.leaves(path)
            else:
                yield path, child


def _read(text: str, name: str) -> _Element:
    """Parse with expat; DumpError (file, line) for malformed XML or any entity trick."""
    parser = expat.ParserCreate()
    stack: list[_Element] = [_Element("", {}, 0)]

    def refuse(reason: str):
        raise DumpError(name, parser.CurrentLineNumber, reason)

    def doctype(_name, _sysid, _pubid, has_internal_subset):
        if has_internal_subset:
            refuse("the DOCTYPE has an internal subset: refused (nvidia-smi names an "
                   "external DTD only)")

    def start(tag, attrs):
        element = _Element(tag, attrs, parser.CurrentLineNumber)
        stack[-1].children.append(element)
        stack.append(element)

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = lambda *a: refuse("entity declarations are refused")
    parser.UnparsedEntityDeclHandler = lambda *a: refuse("entity declarations are refused")
    parser.ExternalEntityRefHandler = lambda *a: refuse("external entities are refused")
    parser.SkippedEntityHandler = lambda *a: refuse("undeclared entity reference refused")
    parser.StartElementHandler = start
    parser.EndElementHandler = lambda tag: stack.pop()
    parser.CharacterDataHandler = lambda data: stack[-1].text.append(data)
    try:
        parser.Parse(text.lstrip("\ufeff").encode("utf-8"), True)
    except expat.ExpatError as exc:
        raise DumpError(name, exc.lineno, f"malformed XML: {expat.errors.messages[exc.code]}"
                        ) from None
    [top] = stack[0].children or [None]
    if top is None or top.tag != "nvidia_smi_log":
        raise DumpError(name, top.line if top else 1,
                        "not `nvidia-smi -q -x` output: the root element is not <nvidia_smi_log>")
    return top


def _put(section: Node, path: tuple[str, ...], value: str, line: int) -> None:
    """Add `path` under `section` (reusing existing sections), the last key with `value`."""
    node = section
    for key in path[:-1]:
        found = node.find(key)
        if found is None:
            found = Node(key, None, line)
            node.children.append(found)
        node = found
    leaf = node.find(path[-1])
    if leaf is None:
        node.children.append(Node(path[-1], value, line))
    elif leaf.value is None:  # a section made for a child first ("HW Slowdown")
        leaf.value = value


def _translate(element: _Element, table: dict, into: Node) -> None:
    for path, leaf in element.leaves():
        if path in table:
            _put(into, table[path], leaf.value, leaf.line)
        elif path[:2] == ("ecc_errors", "volatile") and "uncorrectable" in path[-1]:
            # "dram_uncorrectable" → "ECC Errors / Volatile / Dram Uncorrectable"
            title = " ".join(w.capitalize() for w in path[-1].split("_"))
            _put(into, ("ECC Errors", "Volatile", title), leaf.value, leaf.line)


def xml_tree(text: str, name: str = "<dump>") -> Node:
    """The Node tree (as nvsmi_tree._parse_tree builds for text) of an XML report."""
    top = _read(text, name)
    root = Node("", None, 0)
    for child in top.children:
        if child.tag in HEADER_KEYS:
            root.children.append(Node(HEADER_KEYS[child.tag], child.value, child.line))
        elif child.tag == "gpu":
            bus = child.attrs.get("id", "")
            section = Node(f"GPU {bus}", None, child.line)
            root.children.append(section)
            _translate(child, XML_KEYS, section)
            for holder in (c for c in child.children if c.tag == "mig_devices"):
                for mig in (c for c in holder.children if c.tag == "mig_device"):
                    block = Node("MIG Device", None, mig.line)
                    section.children.append(block)
                    _translate(mig, MIG_KEYS, block)
            for holder in (c for c in child.children if c.tag == "processes"):
                procs = Node("Processes", None, holder.line)
                section.children.append(procs)
                for info in (c for c in holder.children if c.tag == "process_info"):
                    pid = next((c for c in info.children if c.tag == "pid"), None)
                    proc = Node("Process ID", pid.value if pid else "", info.line)
                    procs.children.append(proc)
                    _translate(info, PROCESS_KEYS, proc)
    return root


def looks_like_xml(text: str) -> bool:
    """True when the first non-blank character is '<' (XML), else the text form."""
    return text.lstrip("\ufeff \t\r\n").startswith("<")
