"""Whether a driver can support the CUDA version a runner reports.

`nvidia-smi` prints, as "CUDA Version", the newest CUDA the driver supports. The minimum
Linux x86_64 driver of each CUDA major.minor (its GA release) is NVIDIA's "CUDA Toolkit
and Corresponding Driver Versions" table (CUDA Toolkit release notes, "CUDA Driver",
https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/): a node reporting CUDA X.Y
with an older driver is not telling the truth, and would qualify for bids' min_cuda it
cannot run. Rule and examples: docs/RUNNER_PROTOCOL.md, "Inventory".
"""

from __future__ import annotations

import re

#: (CUDA major, minor) → minimum Linux driver (GA release), from NVIDIA's table.
MIN_DRIVER: dict[tuple[int, int], tuple[int, ...]] = {
    (7, 0): (346, 46), (7, 5): (352, 31), (8, 0): (367, 48), (9, 0): (384, 81),
    (9, 1): (390, 46), (9, 2): (396, 26), (10, 0): (410, 48), (10, 1): (418, 39),
    (10, 2): (440, 33), (11, 0): (450, 36, 6), (11, 1): (455, 23), (11, 2): (460, 27, 3),
    (11, 3): (465, 19, 1), (11, 4): (470, 42, 1), (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1), (11, 7): (515, 43, 4), (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13), (12, 1): (530, 30, 2), (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6), (12, 4): (550, 54, 14), (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3), (12, 8): (570, 26), (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6), (13, 1): (590, 44, 1),
}
_CUDA = re.compile(r"^(\d{1,3})\.(\d{1,3})(?:\.\d{1,4})?$")
_DRIVER = re.compile(r"^\d{1,4}(?:\.\d{1,4}){0,3}$")


def _text(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def refusal(driver_version: str, cuda_version: str) -> tuple[str, str] | None:
    """(field, reason) when `cuda_version` ("12.2") cannot be the CUDA of driver
    `driver_version` ("535.183.01"); None when it can, or when no CUDA is reported.

    The minimum is the table's row for the largest CUDA ≤ the reported one (a CUDA newer
    than the table needs at least its newest row's driver). A driver given in fewer parts
    ("535") is compared on those parts only (the driver branch)."""
    if not cuda_version:
        return None
    match = _CUDA.match(cuda_version)
    if not match:
        return "cuda_version", f"{cuda_version!r} is not a CUDA version like 12.2"
    if not _DRIVER.match(driver_version):
        return "driver_version", f"{driver_version!r} is not a driver version like 535.183.01"
    cuda = (int(match[1]), int(match[2]))
    known = [v for v in MIN_DRIVER if v <= cuda]
    if not known:
        return "cuda_version", f"CUDA {cuda_version} is older than any CUDA 7.0 or later"
    row = max(known)
    need = MIN_DRIVER[row]
    driver = tuple(int(part) for part in driver_version.split("."))
    if driver < need[:len(driver)]:
        return "cuda_version", (
            f"CUDA {cuda_version} needs driver {_text(need)} or newer (NVIDIA's CUDA Toolkit "
            f"release notes, CUDA {row[0]}.{row[1]}), but the driver is {driver_version}: "
            "report the CUDA version nvidia-smi prints for this driver")
    return None
