"""The API boundary shared by marketplace, providers and settlement: DRF fields for exact
money (decimal USD strings ↔ micro-USD), strict JSON types, unknown fields refused, and
the one pagination of every list."""

from __future__ import annotations

import json
import re

from drf_spectacular.utils import extend_schema_field
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


@extend_schema_field({"type": "object", "additionalProperties": True})
class JsonObjectField(serializers.Field):
    """A free-form JSON object (e.g. a benchmark's `raw` figures) of at most `max_bytes` of
    compact UTF-8 JSON, nested at most `max_depth` levels (the object itself is level 1),
    with no NUL or lone surrogate in any key or string (the one naming it: `raw.a.b`).
    Anything else is a 400 naming the field."""

    default_error_messages = {
        "not_an_object": "must be a JSON object",
        "too_large": "must be at most {kib} KiB of JSON",
        "too_deep": "must nest at most {depth} levels of objects and arrays",
    }

    def __init__(self, *, max_bytes: int, max_depth: int, **kwargs):
        self.max_bytes, self.max_depth = max_bytes, max_depth
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            self.fail("not_an_object")
        if _depth(data) > self.max_depth:
            self.fail("too_deep", depth=self.max_depth)
        found = find_bad_character(data)
        if found is not None:
            path, message = found
            raise serializers.ValidationError({path: [message]})
        size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
        if size > self.max_bytes:
            self.fail("too_large", kib=f"{self.max_bytes / 1024:g}")
        return data

    def to_representation(self, value):
        return value


def _depth(data) -> int:
    """How deep `data` nests objects and arrays (a scalar: 0; {} or []: 1)."""
    deepest, level = 0, [(data, 1)]
    while level:
        value, depth = level.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            items = value.values() if isinstance(value, dict) else value
            level.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return deepest


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that refuses fields it does not know, naming them, instead of
    ignoring them silently (a misspelt `gang_sise` must not place a different order)."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) \
            if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError(dict.fromkeys(unknown, "is not a known field"))
        return super().validate(attrs)


# --- text: NUL and lone surrogates ------------------------------------------------------
# PostgreSQL text and jsonb cannot hold NUL and UTF-8 cannot encode a lone surrogate: a
# string with either would fail at the database (a 500). The API's JSON parser refuses them
# anywhere in a body (marketplace/api/parsers.py), the page forms in every field
# (frontend/forms_fields.py), each with these messages.
_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
NUL_MESSAGE = "must not contain NUL characters (\\u0000)"
SURROGATE_MESSAGE = "must not contain lone surrogates (\\ud800 to \\udfff)"


def bad_character_message(text: str) -> str | None:
    """NUL_MESSAGE or SURROGATE_MESSAGE when `text` holds such a character, else None."""
    found = _BAD_CHARACTER.search(text)
    if found is None:
        return None
    return NUL_MESSAGE if found.group() == "\x00" else SURROGATE_MESSAGE


def escaped(text: str) -> str:
    """`text` with NUL and surrogates written as \\uXXXX (for naming a key that holds one)."""
    return _BAD_CHARACTER.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def find_bad_character(data, path: str = "") -> tuple[str, str] | None:
    """(path, message) of the first string in `data` (parsed JSON) — key or value, at any
    depth — holding NUL or a lone surrogate, or None. Paths as errors.py names fields:
    `a.b`, `a[0].b`; a key holding one is named escaped."""
    if isinstance(data, str):
        message = bad_character_message(data)
        return None if message is None else (path, message)
    if isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{escaped(key)}" if path else escaped(key)
            message = bad_character_message(key)
            if message is not None:
                return where, message
            found = find_bad_character(value, where)
            if found is not None:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found = find_bad_character(value, f"{path}[{i}]")
            if found is not None:
                return found
    return None


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
