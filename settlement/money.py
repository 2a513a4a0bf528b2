"""Exact money: integer micro-USD and the decimal-USD strings of the API.

Plain Python, no Django: the marketplace, the API and the runner's reports all
use these. 1 USD = 1,000,000 micro-USD, the base unit of a 6-decimal stablecoin.
Source of the formats: ../shared/DESIGN.md, "Units".
"""

from __future__ import annotations

import re
from decimal import Decimal

MICROS_PER_USD = 1_000_000
SECONDS_PER_HOUR = 3600
# Largest amount the API accepts anywhere: 10^12 USD, far above any real lease,
# far below a 64-bit column (9.2 × 10^18 micro-USD).
MAX_USD_MICROS = 10**18

_USD_RE = re.compile(r"^(0|[1-9][0-9]{0,12})(\.[0-9]{1,6})?$")


class MoneyFormatError(ValueError):
    """A USD string that is not a plain non-negative decimal with at most 6 places."""


def parse_usd(text: object) -> int:
    """'2.49' → 2_490_000 micro-USD.

    Accepts only a JSON string of digits with an optional '.' and 1–6 decimals
    ("2.49", "2.490000", "0.000001"). Rejects numbers (floats lose cents), signs,
    exponents, NaN, Infinity, spaces, more than 6 places and values above
    MAX_USD_MICROS, raising MoneyFormatError with the precise reason.
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise MoneyFormatError("must be a decimal string in USD such as \"2.49\", not a number")
    if _USD_RE.match(text):
        micros = int(Decimal(text) * MICROS_PER_USD)
        if micros > MAX_USD_MICROS:
            raise MoneyFormatError(f"is larger than the largest amount accepted "
                                   f"({format_usd(MAX_USD_MICROS)} USD)")
        return micros
    stripped = text.strip()
    if stripped != text or not text:
        reason = "must not be empty" if not stripped else "must not contain spaces"
    elif text.startswith("-"):
        reason = "must not be negative"
    elif text.startswith("+"):
        reason = "must be written without a sign, such as \"2.49\""
    elif re.fullmatch(r"[0-9]+(\.[0-9]+)?[eE][-+]?[0-9]+", text):
        reason = "must be a plain decimal, not an exponent, such as \"2.49\""
    elif re.fullmatch(r"[0-9]+\.[0-9]{7,}", text):
        reason = "has more than 6 decimal places (1 micro-USD is the smallest unit)"
    elif re.fullmatch(r"[0-9]{14,}(\.[0-9]{1,6})?", text):
        reason = (f"is larger than the largest amount accepted "
                  f"({format_usd(MAX_USD_MICROS)} USD)")
    else:
        reason = "must be a decimal string in USD with at most 6 decimal places, such as \"2.49\""
    raise MoneyFormatError(reason)


def format_usd(micros: int) -> str:
    """2_490_000 → '2.490000' (always 6 places; negative amounts keep their sign)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(int(micros)), MICROS_PER_USD)
    return f"{sign}{whole}.{frac:06d}"


def lease_cost(price_per_gpu_hour: int, gpus: int, seconds: int) -> int:
    """Cost of `gpus` GPUs for `seconds` at `price_per_gpu_hour` micro-USD: per-second
    billing, floored (DESIGN.md: price × gpus × seconds // 3600)."""
    if price_per_gpu_hour < 0 or gpus < 0 or seconds < 0:
        raise ValueError("price, gpus and seconds must not be negative")
    return price_per_gpu_hour * gpus * seconds // SECONDS_PER_HOUR
