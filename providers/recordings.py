"""The recorded hosts of data/nvidia-smi/ that a runner's `--simulate` can register, and
the first one whose GPUs no node registered yet (the token page's hint)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from providers.models import Gpu

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
# the README's suggestions first, then the other whole recordings by name
PREFERRED_DUMPS = ("a10-x1.driver-535.129.03.txt", "titan-v-x1.driver-560.35.03.txt")
_UUID = re.compile(r"\bGPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_ZEROED = "GPU-00000000-0000-0000-0000-000000000000"


@functools.lru_cache(maxsize=64)
def _dump_uuids(path: Path, mtime_ns: int) -> frozenset[str]:
    return frozenset(_UUID.findall(path.read_text(errors="replace")))  # as the runner sends


def recorded_dumps(folder: Path = RECORDINGS) -> list[tuple[Path, frozenset[str]]]:
    """The recorded hosts of data/nvidia-smi/ a runner's `--simulate` can register as they
    are: `nvidia-smi -q` text or `-q -x` XML naming GPU UUIDs, none of them zeroed (such a
    recording gets UUIDs of the runner's making) and not a cut-down copy; preferred first."""
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir()
                   if p.suffix in (".txt", ".xml") and not p.name.endswith(".L.txt")
                   and "truncated" not in p.name)
    files.sort(key=lambda p: (p.name not in PREFERRED_DUMPS,
                              PREFERRED_DUMPS.index(p.name) if p.name in PREFERRED_DUMPS
                              else 0, p.name))
    found = []
    for path in files:
        uuids = _dump_uuids(path, path.stat().st_mtime_ns)
        if uuids and _ZEROED not in {u.upper() for u in uuids}:
            found.append((path, uuids))
    return found


def unregistered_dump(folder: Path = RECORDINGS) -> str | None:
    """"data/nvidia-smi/<file>": the first recorded host (recorded_dumps) whose GPU UUIDs
    no node has registered yet (retired nodes' included: a GPU stays its node's), for the
    token page's `--simulate` hint; None when every one is taken or none is here."""
    dumps = recorded_dumps(folder)
    if not dumps:
        return None
    every = set().union(*(uuids for _, uuids in dumps))
    taken = set(Gpu.every.filter(uuid__in=every).values_list("uuid", flat=True))
    for path, uuids in dumps:
        if not uuids & taken:
            return f"data/nvidia-smi/{path.name}"
    return None
