"""The API reads JSON only, and refuses a body nested deeper than MAX_DEPTH before
parsing it: deep nesting makes parsers and serializers recurse until they fail (or,
deep enough, overflow the C stack and take the worker down). An object that names a
key twice is refused too (DuplicateKey, a 400 naming the key): JSON (RFC 8259 §4) leaves
duplicate names to the reader, and Python's json would keep the last one silently, so
`{"price": "0.01", "price": "5"}` would place an order at 5. A string holding NUL
(`\\u0000`) or a lone surrogate (`\\ud800`), as a value or a key at any depth, is refused
too (BadCharacter, a 400 naming where it is: `command[2]`, `results[0].raw.note`):
PostgreSQL text and jsonb cannot store NUL, and UTF-8 cannot encode a lone surrogate, so
either would otherwise fail at the database, as a 500."""

from __future__ import annotations

import json
import re

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils.json import strict_constant

from core.text import find_bad_character

MAX_DEPTH = 32
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
# the escapes that can produce a NUL or a surrogate (a raw control character is invalid JSON)
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def json_depth_exceeds(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON text nests arrays/objects deeper than `limit` (strings skipped)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot be deeper than the number of openers
    depth = 0
    for ch in _STRING.sub(b'""', body):
        if ch in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif ch in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


class FieldParseError(ParseError):
    """A body refused while parsing, because of what one field holds: `key` names it and
    `message` says why. A ParseError, so callers that catch parse errors (the bid fast
    path) treat it as one; errors.py answers it as a 400 naming the field."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class DuplicateKey(FieldParseError):
    """A JSON object names `key` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key, "appears more than once in a JSON object (each key at most once)")


class BadCharacter(FieldParseError):
    """A string at `key` (a path such as `results[0].raw.note`) holds NUL or a lone
    surrogate; a key holding one is named with the character escaped (`na\\u0000me`)
    (core.text.find_bad_character)."""


def _object_without_duplicates(pairs: list[tuple[str, object]]) -> dict:
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKey(key)
        obj[key] = value
    return obj


class StrictJSONParser(JSONParser):
    """DRF's JSONParser (UTF-8 or the declared charset; NaN and Infinity refused) with the
    size (DATA_UPLOAD_MAX_MEMORY_SIZE), depth, duplicate-key and NUL/surrogate checks
    above."""

    def parse(self, stream, media_type=None, parser_context=None):
        body = stream.read() if stream is not None else b""
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and len(body) > limit:
            raise ParseError("the request body is too large")
        if json_depth_exceeds(body):
            raise ParseError(f"JSON parse error - the body is nested deeper than {MAX_DEPTH} "
                             "levels")
        encoding = get_encoding(parser_context or {})  # text codecs only (not bz2_codec)
        try:
            text = body.decode(encoding)
            data = json.loads(text, parse_constant=strict_constant,
                              object_pairs_hook=_object_without_duplicates)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN
            raise ParseError(f"JSON parse error - {exc}") from None
        # only a body with such an escape is walked (json.loads refuses the raw characters)
        if _SUSPECT_ESCAPE.search(text):
            found = find_bad_character(data)
            if found is not None:
                raise BadCharacter(*found)
        return data
