"""DRF fields for exact money at the API boundary (decimal USD strings ↔ micro-USD)."""

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
        try:
            micros = parse_usd(data)
        except MoneyFormatError as exc:
            self.fail("invalid", reason=str(exc))
        if self.positive and micros <= 0:
            self.fail("invalid", reason="must be greater than zero")
        return micros

    def to_representation(self, value):
        return None if value is None else format_usd(value)


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON number without a fraction: "5", 5.0 and true are
    refused (DRF's IntegerField accepts them)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string that must be a JSON string: 123 or true are refused (DRF's CharField
    turns them into "123" and "True")."""

    default_error_messages = {"not_a_string": "must be a string"}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses fields it does not know, naming them, instead of
    ignoring them silently (a misspelt `gang_sise` must not place a different order)."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) \
            if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError(dict.fromkeys(unknown, "is not a known field"))
        return super().validate(attrs)
