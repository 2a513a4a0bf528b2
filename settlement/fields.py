"""Money at the API boundary: a DRF field for exact USD (decimal USD strings ↔ integer
micro-USD). The strict JSON types, unknown-field refusal and pagination every API uses
are in core/ (core/fields.py, core/pagination.py)."""

from __future__ import annotations

from rest_framework import serializers

from settlement.money import MoneyFormatError, format_usd, parse_usd


class UsdField(serializers.Field):
    """A decimal USD string with at most 6 places in, integer micro-USD inside,
    a 6-place string out. Numbers, NaN, exponents and signs are refused."""

    default_error_messages = {"invalid": "{reason}"}

    def __init__(self, *, positive: bool = True, **kwargs):
        self.positive = positive
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):  # parse_usd would call true "a number"
            self.fail("invalid", reason="must be a decimal string in USD such as \"2.49\", "
                      f"not {_json_kind(data)}")
        try:
            micros = parse_usd(data)
        except MoneyFormatError as exc:
            self.fail("invalid", reason=str(exc))
        if self.positive and micros <= 0:
            self.fail("invalid", reason="must be greater than zero")
        return micros

    def to_representation(self, value):
        return None if value is None else format_usd(value)


def _json_kind(data) -> str:
    if isinstance(data, bool):
        return "true" if data else "false"
    if isinstance(data, int | float):
        return "a number"
    if isinstance(data, list):
        return "an array"
    if isinstance(data, dict):
        return "an object"
    return "that"
