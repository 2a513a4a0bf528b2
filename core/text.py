"""Text that PostgreSQL or UTF-8 cannot hold: NUL and lone surrogates, found anywhere in
parsed JSON and named by path, with the one message for each."""

from __future__ import annotations

import re

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
