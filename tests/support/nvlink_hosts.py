"""Recorded H100 x8 hosts with an NVLink section, built from data/nvidia-smi's recording.

No recording of data/nvidia-smi has `nvidia-smi -q`'s NVLink section, so these copy
h100-80gb-hbm3-x8.driver-535.183.01.txt (its SOURCE row) and add one to every GPU, in the
shape nvsmi._nvlinks reads ("Link N : <speed>" with "Remote PCI Bus Id"):
- "nvswitch": 18 active links per GPU to four NVSwitches (bus ids of no GPU), as on an
  HGX H100 board: every GPU reaches every other (full mesh);
- "pairs": one link per GPU straight to its neighbour (GPU 0-1, 2-3, …), as with bridges;
- "pcie": no NVLink section at all (the recording as it is).
`tag` replaces the UUIDs' last hex digits so that two such hosts can register at once.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H100_X8 = ROOT / "data" / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
SWITCHES = [f"00000000:{b}:00.0" for b in ("05", "06", "07", "08")]


def _section(remotes: list[str]) -> str:
    lines = ["    NVLink\n"]
    for n, remote in enumerate(remotes):
        lines.append(f"{'        Link ' + str(n):<41} : 26.562 GB/s\n")
        lines.append(f"{'            Remote PCI Bus Id':<41} : {remote}\n")
    return "".join(lines)


def h100_host(tmp_path: Path, kind: str, tag: str = "") -> Path:
    """The recorded H100 x8 host as `kind` ("nvswitch", "pairs", "pcie"): a dump file in
    `tmp_path` (see the module docstring)."""
    text = H100_X8.read_text()
    buses = re.findall(r"^GPU (\S+)$", text, flags=re.M)
    parts = re.split(r"(?m)^(?=GPU \S+$)", text)
    out = [parts[0]]
    for n, part in enumerate(parts[1:]):
        if kind == "nvswitch":
            remotes = [SWITCHES[k % 4] for k in range(18)]
        elif kind == "pairs":
            remotes = [buses[n ^ 1]]
        else:
            remotes = []
        if remotes:
            fb = "    FB Memory Usage\n"
            part = part.replace(fb, _section(remotes) + fb, 1)
        out.append(part)
    text = "".join(out)
    if tag:
        text = re.sub(rf"(GPU UUID\s+: GPU-[0-9a-f-]+?)[0-9a-f]{{{len(tag)}}}$",
                      lambda m: m.group(1) + tag, text, flags=re.M)
    path = tmp_path / f"h100-{kind}{tag}.q.txt"
    path.write_text(text)
    return path
