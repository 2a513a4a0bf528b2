"""The recorded MIG-partitioned hosts as the runner reads them (no Django: the runner's
tests use them too): parsed from data/nvidia-smi/, never built by hand."""

from __future__ import annotations

from pathlib import Path

from providers.runner.nvsmi import parse_dump, parse_text, read_text
from providers.runner.sim_uuids import own_uuids

DUMPS = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi"

#: The recorded MIG-partitioned H100 (`nvidia-smi -q` and the `-L` beside it), its zeroed
#: UUIDs replaced as a runner with --simulate replaces them (runner/sim_uuids.py; the
#: marketplace refuses the all-zero UUID), with the salt "tests".
H100_MIG_DUMP = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"
H100_MIG, _ = own_uuids(parse_dump(H100_MIG_DUMP), "tests", H100_MIG_DUMP.name)

#: The recorded MIG-partitioned A100 80GB (`nvidia-smi -q -x`, GPU 1 of 4: 4 MIG devices of
#: 14 SMs and 19968 MiB — the 1g.20gb profile — in GPU instances 3 to 6). `-q -x` prints no
#: MIG UUID and no `-L` was recorded with it: A100_LISTING is one made here (GPU UUID from
#: the report, MIG UUIDs invented), for `--simulate` as `<base>.L.txt` beside a copy.
A100_MIG_DUMP = DUMPS / "a100-sxm4-80gb-mig-x1of4.telegraf.xml"
A100_LISTING = ("GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n"
                + "".join(f"  MIG 1g.20gb     Device  {i}: "
                          f"(UUID: MIG-a1000000-0000-0000-0000-00000000000{i + 3})\n"
                          for i in range(4)))
A100_MIG = parse_text(read_text(A100_MIG_DUMP), A100_MIG_DUMP.name,
                      listing=(A100_LISTING, "a100-sxm4-80gb-mig-x1of4.telegraf.L.txt"))


def with_a100_listing(directory: Path) -> Path:
    """A copy of the A100 MIG report in `directory` with A100_LISTING beside it (the files
    `--simulate` reads); returns the report's path."""
    report = directory / A100_MIG_DUMP.name
    report.write_bytes(A100_MIG_DUMP.read_bytes())
    (directory / "a100-sxm4-80gb-mig-x1of4.telegraf.L.txt").write_text(A100_LISTING)
    return report
