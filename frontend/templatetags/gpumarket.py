"""Money and words shown one way on every page (issue 14, "Cosmetic").

`{% load gpumarket %}`, then:
- `usd`: balances and totals, 2 decimals rounded half up to the cent: "$248.44",
  "-$1.20" (an amount under one cent, never "$0.00" for something: in full, "$0.005678");
  `usd_change`: the same with its sign, "+$1.20", "—" for no change;
  `usd_exact`: every micro-USD, 2 to 6 decimals: "$0.005678" (for a title);
- `price`: a price per GPU-hour at price precision (up to 6 places, trailing zeros
  trimmed to at least 2): "$2.865 /GPU-h";
- `gpus`: "1 GPU", "2 GPUs";
- `status_word`: an enum value in people's words ("partially_filled" → "partly filled",
  "second_price" → "second price", "GTC" → "good till cancelled").
A money filter takes integer micro-USD, or a decimal USD string as the views' `usd()`
writes it ("2.49", "$2.490000"); None, "" and "—" show "—"; anything else is shown as
given (never an error page).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template

from settlement.money import MICROS_PER_USD

register = template.Library()

DASH = "—"

STATUS_WORDS = {
    "partially_filled": "partly filled",
    "second_price": "second price",
    "uniform_price": "uniform price",
    "first_price": "first price",
    "GTC": "good till cancelled",
    "IOC": "immediate or cancel",
    "FOK": "fill or kill",
    "bid": "bid", "ask": "ask",
}


def micros_of(value) -> int | None:
    """Integer micro-USD from an int or a decimal USD string ("2.49", "$2.490000",
    "-0.5"); None when it is neither."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return int(value * MICROS_PER_USD)
    if isinstance(value, str):
        text = value.strip().replace("$", "").replace(",", "")
        try:
            amount = Decimal(text)
        except InvalidOperation:
            return None
        if not amount.is_finite():
            return None
        return int((amount * MICROS_PER_USD).to_integral_value(ROUND_HALF_UP))
    return None


def _sign(micros: int) -> str:
    return "-" if micros < 0 else ""


@register.filter
def usd(value) -> str:
    """Micro-USD as dollars and cents: 248_444_999 → "$248.44"; 5_678 → "$0.005678"."""
    micros = micros_of(value)
    if micros is None:
        return DASH if value in (None, "", DASH) else str(value)
    if 0 < abs(micros) < 10_000:
        return _precise(micros)
    cents = (Decimal(abs(micros)) / 10_000).to_integral_value(ROUND_HALF_UP)
    whole, rest = divmod(int(cents), 100)
    return f"{_sign(micros)}${whole}.{rest:02d}"


@register.filter
def usd_change(value) -> str:
    """A signed change: 1_200_000 → "+$1.20", -5_678 → "-$0.005678", 0 → "—"."""
    micros = micros_of(value)
    if micros is None or micros == 0:
        return DASH if micros == 0 or value in (None, "", DASH) else str(value)
    return usd(micros) if micros < 0 else f"+{usd(micros)}"


def _precise(micros: int) -> str:
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{_sign(micros)}${whole}.{digits}"


@register.filter
def usd_exact(value) -> str:
    """Every micro-USD, 2 to 6 decimals: 5_678 → "$0.005678"; 2_000_000 → "$2.00"."""
    micros = micros_of(value)
    if micros is None:
        return DASH if value in (None, "", DASH) else str(value)
    return _precise(micros)


@register.filter
def price(value) -> str:
    """A price per GPU-hour: 2_865_000 → "$2.865 /GPU-h" (up to 6 places)."""
    micros = micros_of(value)
    if micros is None:
        return DASH if value in (None, "", DASH) else str(value)
    return f"{_precise(micros)} /GPU-h"


@register.filter
def gpus(value) -> str:
    """1 → "1 GPU", 2 → "2 GPUs"; None → "—"."""
    if value is None or value == "":
        return DASH
    try:
        n = int(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


@register.filter
def status_word(value) -> str:
    """An enum value in people's words: "partially_filled" → "partly filled"."""
    if value is None or value == "":
        return DASH
    text = str(value)
    return STATUS_WORDS.get(text, text.replace("_", " "))
