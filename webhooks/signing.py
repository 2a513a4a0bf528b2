"""Signatures like Stripe's: header `Gpumarket-Signature: t=<unix seconds>,v1=<hex
HMAC-SHA256(secret, f"{t}.{body}")>` over the exact body bytes. No Django."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

HEADER = "Gpumarket-Signature"
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh signing secret: `whsec_` + 43 URL-safe characters (256 bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def sign(secret: str, body: bytes, t: int) -> str:
    """The hex HMAC-SHA256 of f"{t}." + body under `secret`."""
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def header(secret: str, body: bytes, t: int | None = None) -> str:
    """The Gpumarket-Signature value for `body` at unix time `t` (now by default)."""
    t = int(time.time()) if t is None else t
    return f"t={t},v1={sign(secret, body, t)}"


def verify(secret: str, body: bytes, value: str, *, tolerance: int = 300,
           now: float | None = None) -> bool:
    """Whether `value` (a Gpumarket-Signature header) signs `body` under `secret` with a
    timestamp within `tolerance` seconds of `now`."""
    parts: dict[str, list[str]] = {}
    for item in value.split(","):
        key, _, val = item.strip().partition("=")
        parts.setdefault(key, []).append(val)
    try:
        t = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    expected = sign(secret, body, t)
    return any(hmac.compare_digest(expected, v) for v in parts.get("v1", []))
