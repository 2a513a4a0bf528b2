"""The API boundary shared by marketplace, providers and settlement: DRF fields for exact
money (decimal USD strings ↔ micro-USD), strict JSON types, unknown fields refused, and
the one pagination of every list."""

from __future__ import annotations

import re

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

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


# --- pagination ------------------------------------------------------------------------
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_DIGITS = re.compile(r"[0-9]{1,18}")


def _query_whole(request, name: str, *, low: int, high: int | None, says: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    value = int(raw) if _DIGITS.fullmatch(raw) else None
    if value is None or value < low or (high is not None and value > high):
        raise serializers.ValidationError({name: [says]})
    return value


class Pagination(LimitOffsetPagination):
    """The one pagination of every API list: `{count, next, previous, results}`,
    `?limit=` (1 to MAX_LIMIT, default DEFAULT_LIMIT) and `?offset=` (0 or more). A limit
    or offset that is not such a whole number is a 400 naming the parameter (DRF's
    LimitOffsetPagination would silently use its default instead)."""

    default_limit = DEFAULT_LIMIT
    max_limit = MAX_LIMIT

    def paginate_queryset(self, queryset, request, view=None):
        # both checked before anything is read
        self._limit = _query_whole(request, self.limit_query_param, low=1, high=MAX_LIMIT,
                                   says=f"must be a whole number from 1 to {MAX_LIMIT}")
        self._offset = _query_whole(request, self.offset_query_param, low=0, high=None,
                                    says="must be a whole number, 0 or more")
        return super().paginate_queryset(queryset, request, view)

    def get_limit(self, request):
        return self.default_limit if self._limit is None else self._limit

    def get_offset(self, request):
        return self._offset or 0

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for p in parameters:
            if p["name"] == self.limit_query_param:
                p["schema"].update(minimum=1, maximum=MAX_LIMIT, default=DEFAULT_LIMIT)
                p["description"] = (f"how many results, 1 to {MAX_LIMIT} (default "
                                    f"{DEFAULT_LIMIT}); anything else is a 400")
            elif p["name"] == self.offset_query_param:
                p["schema"].update(minimum=0, default=0)
                p["description"] = "how many results to skip, 0 or more; anything else is a 400"
        return parameters


def paginated(view, request, queryset, serializer_class, *, context=None):
    """The list answer {count, next, previous, results} of `queryset` (Pagination)."""
    paginator = Pagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(
        serializer_class(page, many=True, context=context or {}).data)
