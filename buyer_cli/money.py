"""Money as the API writes it: decimal USD strings ("2.490000"), integer micro-USD inside;
Decimal and int only, never float (DESIGN.md "Units")."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MICROS = 1_000_000
_USD = re.compile(r"[0-9]+(\.[0-9]{1,6})?|\.[0-9]{1,6}")


def parse_usd(text: str) -> int:
    """"2.49" → 2490000 micro-USD. ValueError for anything but a plain non-negative decimal
    with at most 6 places (no sign, exponent, NaN or thousands separator)."""
    if not isinstance(text, str) or not _USD.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not an amount in USD with at most 6 decimals "
                         "(such as 2.49)")
    try:
        return int(Decimal(text.strip()) * MICROS)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount in USD") from None


def usd(micros: int) -> str:
    """2490000 → "2.490000" (6 places, a leading "-" below zero)."""
    sign = "-" if micros < 0 else ""
    whole, rest = divmod(abs(int(micros)), MICROS)
    return f"{sign}{whole}.{rest:06d}"


def shown(value) -> str:
    """An API money string as shown to people ("$2.490000"); "-" for null."""
    if value is None or value == "":
        return "-"
    try:
        return "$" + usd(parse_usd(str(value).lstrip("-")) * (-1 if str(value).startswith("-")
                                                             else 1))
    except ValueError:
        return str(value)


def lease_cost(price_micros: int, gpus: int, seconds: int) -> int:
    """price × gpus × seconds // 3600: the lease cost rule (DESIGN.md, per-second floor)."""
    return price_micros * gpus * seconds // 3600
