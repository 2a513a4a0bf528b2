"""What real hosts print around the report: blank lines, CRLF, 51-wide keys, XML, `-L`,
`nvlink -s`, MIG blocks, and the MIG sections that contradict themselves."""

from __future__ import annotations

import shutil

import pytest

from providers.runner.gpu_processes import DumpProcesses, GpuProcess
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import DumpError, dump_files, load_dump, parse_dump, parse_text
from providers.runner.nvsmi_health import health_from_tree
from providers.runner.nvsmi_listing import parse_list, parse_nvlink_status

from .runner_helpers import A10, DUMPS, H100

H100_MIG = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"
H100_MIG_L = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.L.txt"
T4_XML = DUMPS / "t4-x1.telegraf.xml"


def _pair(tmp_path, q_text, l_text=None, base="host"):
    (tmp_path / f"{base}.q.txt").write_text(q_text, encoding="utf-8", newline="")
    if l_text is not None:
        (tmp_path / f"{base}.L.txt").write_text(l_text, encoding="utf-8")
    return tmp_path / f"{base}.q.txt"


def test_crlf_and_leading_blank_lines_read_like_the_recording():
    text = A10.read_text()
    crlf = "\r\n\r\n" + text.replace("\n", "\r\n")
    assert parse_text(crlf, "a10.txt").gpus == parse_text(text, "a10.txt").gpus


def test_a_text_without_its_banner_is_refused_at_its_first_line():
    text = "\n\n" + A10.read_text().replace("==============NVSMI LOG==============\n", "")
    with pytest.raises(DumpError, match=r"^a10\.txt:4: missing the"):
        parse_text(text, "a10.txt")


def test_xml_matches_the_text_form_fields_and_health():
    [gpu] = parse_dump(T4_XML, classify=False).gpus
    assert (gpu.uuid, gpu.pci_bus_id, gpu.memory_mib) == (
        "GPU-d37e67a5-91dd-3774-a5cb-99096249601a", "00000000:00:1E.0", 15360)
    _inv, tree = load_dump(T4_XML, classify=False)
    reading = health_from_tree(tree)[gpu.uuid]
    assert (reading["temperature_c"], reading["power_w"], reading["utilization_pct"]) == (
        40, 26.78, 0)
    assert reading["ecc_uncorrectable"] == 0
    assert (reading["retired_pages"], reading["retired_pages_pending"]) == (0, False)


@pytest.mark.parametrize(("doctype", "words"), [
    ('<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaa">]>', "internal subset"),
    ('<!DOCTYPE nvidia_smi_log SYSTEM "x.dtd">\n<!-- --><nvidia_smi_log>&a;', "entity"),
])
def test_xml_entities_are_refused(doctype, words):
    text = f'<?xml version="1.0" ?>\n{doctype}\n<nvidia_smi_log></nvidia_smi_log>\n'
    with pytest.raises(DumpError, match=words) as caught:
        parse_text(text, "evil.xml")
    assert caught.value.line in (2, 3)


def test_malformed_xml_names_its_line():
    text = T4_XML.read_text().replace("</product_name>", "</product_nam>", 1)
    with pytest.raises(DumpError, match=r"^t4\.xml:\d+: malformed XML: mismatched tag"):
        parse_text(text, "t4.xml")


def test_listing_gives_profiles_without_the_compute_instance_prefix():
    gpus = parse_list((DUMPS / "h200-mig-x1.utku-exporter-590.48.01.L.txt").read_text())
    [gpu] = gpus
    assert (gpu.index, gpu.name) == (0, "NVIDIA H200")
    assert [m.profile for m in gpu.migs] == ["3g.71gb", "3g.71gb", "2g.35gb", "1g.18gb",
                                             "1g.18gb"]
    with pytest.raises(DumpError, match=r"^x\.L\.txt:2: not a line of this listing"):
        parse_list("GPU 0: NVIDIA H200 (UUID: GPU-1)\n  garbage\n", "x.L.txt")


def test_nvlink_status_file_beside_the_report_fills_the_links(tmp_path):
    shutil.copy(H100, tmp_path / "h100.q.txt")
    uuids = [g.uuid for g in parse_dump(H100).gpus]
    lines = []
    for n, uuid in enumerate(uuids):
        lines.append(f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {uuid})")
        lines += [f"\t Link {k}: 26.562 GB/s" for k in range(17)] + ["\t Link 17: <inactive>"]
    (tmp_path / "h100.nvlink.txt").write_text("\n".join(lines) + "\n")
    gpus = parse_dump(tmp_path / "h100.q.txt").gpus
    assert [len([x for x in g.nvlinks if x.active]) for g in gpus] == [17] * 8
    assert gpus[0].nvlinks[17].active is False and gpus[0].nvlinks[0].remote_pci_bus_id is None
    assert parse_nvlink_status("GPU 0: X (UUID: GPU-1)\n\t Link 3: <inactive>\n")[0].links == {
        3: (False, "<inactive>")}
    assert parse_nvlink_status("") == []  # a host without NVLink prints nothing
    (tmp_path / "h100.nvlink.txt").write_text("")
    assert {g.nvlinks for g in parse_dump(tmp_path / "h100.q.txt").gpus} == {()}


def test_nvlink_section_in_a_report_is_read():
    text = A10.read_text().replace(
        "    FB Memory Usage\n",
        "    NVLink\n        Link 0                            : Active\n"
        "            Remote PCI Bus Id             : 0000:53:00.0\n"
        "        Link 1                            : <inactive>\n    FB Memory Usage\n", 1)
    [gpu] = parse_text(text, "a10.txt").gpus
    assert [(x.link, x.active, x.remote_pci_bus_id) for x in gpu.nvlinks] == [
        (0, True, "00000000:53:00.0"), (1, False, None)]


def test_a_directory_holding_the_pair_is_one_host(tmp_path):
    shutil.copy(H100_MIG, tmp_path / "h.q-idle.txt")
    shutil.copy(H100_MIG_L, tmp_path / "h.L.txt")
    assert dump_files(tmp_path).listing == tmp_path / "h.L.txt"
    [gpu] = parse_dump(tmp_path, classify=False).gpus
    assert [m.profile for m in gpu.mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(DumpError, match="holds 2 reports"):
        dump_files(tmp_path)


MIG_Q = H100_MIG.read_text()
MIG_L = H100_MIG_L.read_text()
H200_Q = (DUMPS / "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt").read_text()
H200_L = (DUMPS / "h200-mig-x1.utku-exporter-590.48.01.L.txt").read_text()


@pytest.mark.parametrize(("q", "listing", "where", "words"), [
    (MIG_Q.replace("Enabled\n        Pending", "Disabled\n        Pending", 1), MIG_L, "q",
     "lists MIG devices but its MIG mode is Disabled"),
    (MIG_Q.replace("Total                                      : 40448 MiB",
                   "Total                                      : 90000 MiB"), MIG_L, "q",
     "GPU instance 2 has 90000 MiB, more than the GPU's 81559 MiB"),
    (MIG_Q.replace("GPU Instance ID                                : 3",
                   "GPU Instance ID                                : 2"), MIG_L, "q",
     "GPU instance 2 compute instance 0 repeats line"),
    (MIG_Q.replace("Index                                          : 3",
                   "Index                                          : 2"), MIG_L, "q",
     "MIG device index 2 repeats line"),
    (MIG_Q.replace("Total                                      : 20096 MiB",
                   "Total                                      : 40448 MiB"), MIG_L, "q",
     "hold 100864 MiB together, more than the GPU's 81559 MiB"),
    (MIG_Q, MIG_L.replace("MIG-00000003-0000-0000-0000-000000000003",
                          "MIG-00000002-0000-0000-0000-000000000002"), "L",
     "MIG UUID MIG-00000002-0000-0000-0000-000000000002 is given to two MIG devices"),
    (MIG_Q, MIG_L.replace("  MIG 1g.10gb     Device  3: (UUID: MIG-00000003-0000-0000-0000-"
                          "000000000003)\n", ""), "L",
     "lists MIG device(s) [0, 1, 2] but host.q.txt shows [0, 1, 2, 3]"),
    (MIG_Q, MIG_L.replace("GPU-00000000", "GPU-11111111", 1), "L",
     "lists no GPU GPU-00000000-0000-0000-0000-000000000000, which host.q.txt shows"),
    (H200_Q, H200_L.replace("MIG 2c.3g.71gb", "MIG 2c.4g.71gb"), "L",
     "GPU instance 2 is both 3g.71gb and 4g.71gb"),
])
def test_self_contradicting_mig_sections_are_refused(tmp_path, q, listing, where, words):
    path = _pair(tmp_path, q, listing)
    with pytest.raises(DumpError) as caught:
        parse_dump(path, classify=False)
    name = "host.q.txt" if where == "q" else "host.L.txt"
    assert str(caught.value).startswith(f"{name}:"), str(caught.value)
    assert caught.value.line > (1 if where == "q" else 0)
    assert words in str(caught.value)


def test_mig_report_alone_registers_the_gpu_and_says_what_is_missing(tmp_path):
    inv = parse_dump(_pair(tmp_path, MIG_Q), classify=False)
    [gpu] = inv.gpus
    assert (gpu.mig_mode, gpu.mig_devices) == ("Enabled", ())
    [note] = inv.notes
    assert "4 MIG device(s) left out" in note and "nvidia-smi -L" in note


def test_simulated_mig_host_reads_health_of_the_parent():
    gpus = DumpGpus(H100_MIG)
    [gpu] = gpus.inventory().gpus
    assert len(gpu.mig_devices) == 4
    [reading] = gpus.sample_health([gpu.uuid])
    # 590's report: "Instantaneous Power Draw" (no "Power Draw"), "Utilization / GPU : N/A".
    assert (reading["temperature_c"], reading["power_w"], reading["utilization_pct"]) == (
        42, 72.63, None)


def test_xml_processes_are_the_recorded_hosts_baseline():
    table = DumpProcesses(DUMPS / "a10g-x1.telegraf.xml").table
    assert list(table.values()) == [[GpuProcess(725, "/usr/lib/xorg/Xorg", "G", 22)]]


@pytest.mark.parametrize("value", ["N/A", "[N/A]", "Requested functionality has been deprecated"])
def test_a_required_field_without_a_value_is_refused_naming_it(value):
    text = A10.read_text().replace("GPU-73d12ef7-f589-f867-4259-c7090ab44736", value, 1)
    with pytest.raises(DumpError, match=r"lacks GPU UUID"):
        parse_text(text, "a10.txt")


def test_old_drivers_mig_uuids_in_a_listing():
    # Driver 450/460 named MIG devices "MIG-GPU-<uuid>/<gi>/<ci>".
    [gpu] = parse_list("GPU 0: A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
                       "  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"
                       "/7/0)\n")
    assert [(m.profile, m.uuid) for m in gpu.migs] == [
        ("1g.5gb", "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0")]


def test_a_listing_of_all_gpus_names_a_report_of_one_by_uuid():
    # `nvidia-smi -q -i 0` beside a full `nvidia-smi -L` of a 2-GPU host.
    text = A10.read_text().replace("Attached GPUs                             : 1",
                                   "Attached GPUs                             : 2")
    listing = ("GPU 0: NVIDIA A10 (UUID: GPU-99999999-f589-f867-4259-c7090ab44736)\n"
               "GPU 1: NVIDIA A10 (UUID: GPU-73d12ef7-f589-f867-4259-c7090ab44736)\n")
    inv = parse_text(text, "a10.txt", listing=(listing, "a10.L.txt"))
    assert [g.uuid for g in inv.gpus] == ["GPU-73d12ef7-f589-f867-4259-c7090ab44736"]
    with pytest.raises(DumpError, match="lists 2 GPU"):
        parse_text(A10.read_text(), "a10.txt", listing=(listing, "a10.L.txt"))


def _older_mig_layout(text: str) -> str:
    """The H100 MIG report as drivers before 550 lay it out: the "MIG Device" blocks inside
    a "MIG Devices" section (4 deeper, keys still padded to one column), memory under
    "FB Memory Usage"."""
    out, inside = [], False
    for line in text.split("\n"):
        if line == "    MIG Device":
            if not inside:
                out.append("    MIG Devices")
            inside = True
        elif inside and line.startswith("    ") and not line.startswith("     "):
            inside = False
        if inside:
            line = "    " + line.replace("Shared FB Memory Usage", "FB Memory Usage")
            line = line.replace("     : ", " : ", 1)
        out.append(line)
    return "\n".join(out)


def test_older_drivers_mig_devices_section_reads_the_same(tmp_path):
    older = _older_mig_layout(MIG_Q)
    assert "    MIG Devices\n        MIG Device\n            Index      " in older
    [gpu] = parse_dump(_pair(tmp_path, older, MIG_L), classify=False).gpus
    [expected] = parse_dump(H100_MIG, classify=False).gpus
    assert gpu.mig_devices == expected.mig_devices and len(gpu.mig_devices) == 4
