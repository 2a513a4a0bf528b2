"""The API reads JSON only, and refuses a body nested deeper than MAX_DEPTH before
parsing it: deep nesting makes parsers and serializers recurse until they fail (or,
deep enough, overflow the C stack and take the worker down)."""

from __future__ import annotations

import re

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


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


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        body = stream.read() if stream is not None else b""
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and len(body) > limit:
            raise ParseError("the request body is too large")
        if json_depth_exceeds(body):
            raise ParseError(f"JSON parse error - the body is nested deeper than {MAX_DEPTH} "
                             "levels")
        from io import BytesIO

        try:
            return super().parse(BytesIO(body), media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
