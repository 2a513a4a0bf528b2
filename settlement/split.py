"""The take-rate split of a settled amount (DESIGN.md, "Units").

platform_fee = gross × take_rate_bps // 10000; provider = gross − platform_fee.
The rounding dust goes to the provider: 333 → fee 49, provider 284; 1 → fee 0,
provider 1. The on-chain contract computes the very same integers.
"""

from __future__ import annotations

from typing import NamedTuple

BPS_DENOMINATOR = 10_000


class Split(NamedTuple):
    gross: int        # micro-USD charged to the buyer
    platform_fee: int  # micro-USD to the platform
    provider: int     # micro-USD to the provider


def split(gross: int, take_rate_bps: int) -> Split:
    """Split `gross` micro-USD at `take_rate_bps` basis points (0..10000).

    Raises ValueError for a negative gross or a rate outside 0..10000.
    """
    if gross < 0:
        raise ValueError("gross must not be negative")
    if not 0 <= take_rate_bps <= BPS_DENOMINATOR:
        raise ValueError("take rate must be between 0 and 10000 basis points")
    fee = gross * take_rate_bps // BPS_DENOMINATOR
    return Split(gross, fee, gross - fee)
