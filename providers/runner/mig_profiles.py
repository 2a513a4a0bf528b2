"""MIG GPU-instance profiles per parent GPU class, and the market slug of a slice.

Source: NVIDIA, "Multi-Instance GPU User Guide", chapter "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, r580):
profile names, compute slices (of 7, or of 4 on the A30 and the RTX PRO 6000 Blackwell) and
instances per GPU. The guide gives fractions of SMs, not counts; `sm_count` is the count
`nvidia-smi mig -lgip` prints, kept only where a recording confirms the part (each parent's
`source` says which) and None elsewhere. A slice's market is `<parent slug>.<profile>`
(docs/CATALOG.md); a profile with an extension (`+me`, `+me.all`, `+gfx`, `-me`: media or
graphics engines, same compute and memory) trades in its base profile's market.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GUIDE = "NVIDIA MIG User Guide, Supported MIG Profiles (r580)"
_PROFILE = re.compile(r"^(?P<base>(?P<g>[1-7])g\.(?P<gb>[0-9]{1,3})gb)"
                      r"(?P<ext>\+me\.all|\+me|\+gfx|-me)?$")
_COMPUTE_INSTANCE = re.compile(r"^[1-7]c\.[1-7]g\.")


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: name "1g.10gb", compute slices, memory GB (the name's),
    SMs (None: not confirmed), how many fit on one GPU."""

    name: str
    compute_slices: int
    memory_gb: int
    sm_count: int | None
    max_instances: int


@dataclass(frozen=True)
class MigParent:
    """The MIG layout of one whole-GPU class: compute slices per GPU (7 or 4), the short
    name shown to buyers ("H100"), the source of the figures, its profiles."""

    slices_of: int
    short: str
    source: str
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


def _seven(gb: tuple[int, int, int, int], sms: tuple[int, ...] | None) -> tuple[MigProfile, ...]:
    """The 7-slice layout of A100/H100/H200/B200: 1g ×7, 1g (2/8 memory) ×4, 2g ×3, 3g ×2,
    4g, 7g; `gb` = (1g, 2/8, 4/8, full) memory in the profile names, `sms` in that order."""
    one, quarter, half, full = gb
    rows = [(f"1g.{one}gb", 1, one, 7), (f"1g.{quarter}gb", 1, quarter, 4),
            (f"2g.{quarter}gb", 2, quarter, 3), (f"3g.{half}gb", 3, half, 2),
            (f"4g.{half}gb", 4, half, 1), (f"7g.{full}gb", 7, full, 1)]
    return tuple(MigProfile(name, c, m, sms[i] if sms else None, n)
                 for i, (name, c, m, n) in enumerate(rows))


_A100_SMS = (14, 14, 28, 42, 56, 98)
_H100_SMS = (16, 26, 32, 60, 64, 132)
_RTX_PRO = MigParent(4, "RTX PRO 6000", f"{GUIDE}, table RTX PRO 6000; SM counts not recorded",
                     (MigProfile("1g.24gb", 1, 24, None, 4), MigProfile("2g.48gb", 2, 48, None, 2),
                      MigProfile("4g.96gb", 4, 96, None, 1)))

#: Parent GPU class slug → its MIG layout. Classes not here have no MIG.
MIG_PARENTS: dict[str, MigParent] = {
    "a100-sxm-40gb": MigParent(7, "A100", f"{GUIDE}, table A100 (40GB); SM counts: lgip, "
                               "3g.20gb = 42 in the guide's example", _seven((5, 10, 20, 40),
                                                                             _A100_SMS)),
    "a100-pcie-40gb": MigParent(7, "A100", f"{GUIDE}, table A100 (40GB); SM counts: lgip",
                                _seven((5, 10, 20, 40), _A100_SMS)),
    "a100-sxm-80gb": MigParent(7, "A100", f"{GUIDE}, A100-SXM4-80GB names; SM counts: lgip, "
                               "1g.20gb = 14 recorded (telegraf a100-sxm4 dump)",
                               _seven((10, 20, 40, 80), _A100_SMS)),
    "a100-pcie-80gb": MigParent(7, "A100", f"{GUIDE}, A100 80GB names; SM counts: lgip",
                                _seven((10, 20, 40, 80), _A100_SMS)),
    "a30": MigParent(4, "A30", f"{GUIDE}, table A30-24GB; SM counts: lgip (A30: 56 SMs)",
                     (MigProfile("1g.6gb", 1, 6, 14, 4), MigProfile("2g.12gb", 2, 12, 28, 2),
                      MigProfile("4g.24gb", 4, 24, 56, 1))),
    "h100-sxm-80gb": MigParent(7, "H100", f"{GUIDE}, table H100 (80GB); SM counts: lgip, "
                               "16/32/60 recorded (utku H100 MIG dump)",
                               _seven((10, 20, 40, 80), _H100_SMS)),
    "h100-pcie-80gb": MigParent(7, "H100", f"{GUIDE}, table H100 (80GB); SM counts of the "
                                "PCIe part (114 SMs) not recorded", _seven((10, 20, 40, 80), None)),
    "h100-nvl-94gb": MigParent(7, "H100 NVL", f"{GUIDE}, H100 94GB (profile names from "
                               "mig-parted's default config); SM counts not recorded",
                               _seven((12, 24, 47, 94), None)),
    "gh200-480gb": MigParent(7, "GH200", f"{GUIDE}, H100 96GB on GH200 (names from "
                             "mig-parted's default config); SM counts not recorded",
                             _seven((12, 24, 48, 96), None)),
    "gh200-144gb": MigParent(7, "GH200", "uncertain: GH200 144GB HBM3e names from NVIDIA GPU "
                             "Operator release notes / mig-parted, not the guide's tables; SM "
                             "counts not recorded", _seven((18, 36, 72, 144), None)),
    "h200-sxm-141gb": MigParent(7, "H200", f"{GUIDE}, table H200; SM counts: lgip, 16/32 "
                                "recorded (utku H200 MIG dump)", _seven((18, 35, 71, 141),
                                                                        _H100_SMS)),
    "h200-nvl-141gb": MigParent(7, "H200 NVL", f"{GUIDE}, table H200 (H200 NVL); SM counts "
                                "not recorded", _seven((18, 35, 71, 141), None)),
    "b200": MigParent(7, "B200", f"{GUIDE}, table B200; SM counts not recorded",
                      _seven((23, 45, 90, 180), None)),
    "rtx-pro-6000-blackwell": _RTX_PRO,
    "rtx-pro-6000-blackwell-maxq": _RTX_PRO,
    "rtx-pro-6000-blackwell-server": _RTX_PRO,
}


class UnknownMigProfile(ValueError):
    """`profile` is not a MIG GPU-instance profile of the class `parent`; the message says
    which profiles are."""

    def __init__(self, parent: str, profile: str, why: str) -> None:
        self.parent, self.profile = parent, profile
        super().__init__(why)


def base_profile(profile: str) -> str | None:
    """"1g.10gb+me" → "1g.10gb"; None for a string that is no profile name."""
    match = _PROFILE.match(profile.strip()) if isinstance(profile, str) else None
    return match.group("base") if match else None


def profile_class(parent_slug: str, profile: str) -> str:
    """The market slug of a `profile` slice of a `parent_slug` GPU, e.g.
    ("h100-sxm-80gb", "1g.10gb") → "h100-sxm-80gb.1g.10gb".

    Raises UnknownMigProfile when the class has no MIG or the profile is not one of its."""
    parent = MIG_PARENTS.get(parent_slug)
    if parent is None:
        raise UnknownMigProfile(parent_slug, profile,
                                f"MIG profile {profile!r}: GPU class {parent_slug!r} "
                                f"has no MIG profiles "
                                f"(MIG runs on: {', '.join(sorted(MIG_PARENTS))})")
    valid = ", ".join(p.name for p in parent.profiles)
    if isinstance(profile, str) and _COMPUTE_INSTANCE.match(profile.strip()):
        raise UnknownMigProfile(parent_slug, profile,
                                f"MIG profile {profile!r} names a compute instance; give the "
                                f"GPU instance profile (one of {valid})")
    base = base_profile(profile)
    if base is None or parent.profile(base) is None:
        raise UnknownMigProfile(parent_slug, profile,
                                f"MIG profile {profile!r} is unknown for GPU class "
                                f"{parent_slug!r}; its profiles: {valid}")
    return f"{parent_slug}.{base}"
