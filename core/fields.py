"""Strict DRF fields for JSON input: integers, strings and objects of exactly that JSON
type (DRF coerces "5" and true), and an input serializer that refuses unknown fields,
naming them. Money fields are settlement/fields.py (UsdField)."""

from __future__ import annotations

import json

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.text import find_bad_character


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


class StrictBooleanField(serializers.BooleanField):
    """A boolean that must be a JSON true or false: "true", 1 and "yes" are refused (DRF's
    BooleanField accepts them)."""

    default_error_messages = {"not_a_bool": "must be true or false"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("not_a_bool")
        return data


class StrictNumberField(serializers.FloatField):
    """A measurement (a GPU's power in watts) that must be a JSON number: "12.5" and true
    are refused (DRF's FloatField accepts them); NaN and infinities never reach it (the
    JSON parser refuses them). Never for money, which is a decimal USD string (UsdField)."""

    default_error_messages = {"not_a_number": "must be a JSON number"}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("not_a_number")
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
