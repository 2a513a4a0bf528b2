"""Secrets at rest: a bid's `secrets` ({NAME: value}) and a lease's Jupyter token, sealed
with Fernet (`cryptography`; AES-128-CBC + HMAC-SHA256, authenticated) under the keys of
settings.GPUMARKET_SECRETS_KEYS — the first seals, every one opens (MultiFernet), so a
key is rotated by putting a new one first and re-sealing (`reseal`). No database access.

Only the runner's lease payload (marketplace/api/runner.py) ever opens them; every other
reader gets the names (`sealed_names`). docs/SECRETS.md.
"""

from __future__ import annotations

import json
import logging

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

log = logging.getLogger("gpumarket.secrets")

_boxes: dict[tuple[str, ...], MultiFernet] = {}


class Unsealable(Exception):
    """A sealed value none of the configured keys opens (a key removed too early, or a
    damaged value). Its message names no content."""


def _box() -> MultiFernet:
    keys = tuple(settings.GPUMARKET_SECRETS_KEYS)
    box = _boxes.get(keys)
    if box is None:
        box = _boxes[keys] = MultiFernet([Fernet(k) for k in keys])
    return box


def seal(values: dict[str, str]) -> str:
    """The Fernet token of `values` as compact JSON; "" for no values."""
    if not values:
        return ""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _box().encrypt(text.encode()).decode("ascii")


def unseal(token: str) -> dict[str, str]:
    """The {NAME: value} sealed in `token` ({} for ""). Raises Unsealable."""
    if not token:
        return {}
    return json.loads(unseal_text(token))


def seal_text(text: str) -> str:
    """The Fernet token of one string (a Jupyter token); "" for ""."""
    return _box().encrypt(text.encode()).decode("ascii") if text else ""


def unseal_text(token: str) -> str:
    """The string sealed in `token` ("" for ""). Raises Unsealable."""
    if not token:
        return ""
    try:
        return _box().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeError, ValueError):
        raise Unsealable("a sealed value cannot be opened with the configured "
                         "GPUMARKET_SECRETS_KEY") from None


def sealed_names(token: str) -> list[str]:
    """The sorted names sealed in `token` ([] when it cannot be opened: logged)."""
    try:
        return sorted(unseal(token))
    except Unsealable as exc:
        log.error("%s", exc)
        return []


def reseal(token: str) -> str:
    """`token` sealed again under the first key (MultiFernet.rotate); "" stays ""."""
    if not token:
        return ""
    try:
        return _box().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise Unsealable("a sealed value cannot be opened with the configured "
                         "GPUMARKET_SECRETS_KEY") from None


def same_secrets(token: str, values: dict[str, str]) -> bool:
    """Whether `token` seals exactly `values` (a client_order_id replay's comparison:
    the same secrets seal to a different token each time)."""
    try:
        return unseal(token) == (values or {})
    except Unsealable:
        return False
