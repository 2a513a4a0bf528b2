"""Which URLs a webhook may target: http(s) only, no credentials in the URL, and a host
whose every address is public (no private, loopback, link-local, multicast or reserved
address) unless settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE. Checked at registration and
again at each delivery, after DNS resolution (the delivery connects to the address
checked, so a name that re-resolves elsewhere cannot slip past)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

MAX_URL_CHARS = 2000


class TargetRefused(ValueError):
    """A URL webhooks may not target; the message says why (no secret in it)."""


def parse(url: str) -> SplitResult:
    """`url` split, or TargetRefused for a URL that is not a plain http(s) URL."""
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"must be at most {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise TargetRefused("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise TargetRefused("is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("must be an http:// or https:// URL")
    if not parts.hostname:
        raise TargetRefused("must name a host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("must not carry credentials (user:password@)")
    if port == 0:
        raise TargetRefused("must not use port 0")
    return parts


def resolve(parts: SplitResult) -> list[str]:
    """The addresses of the URL's host, each allowed; TargetRefused when it does not
    resolve or any address is not public (unless private targets are allowed)."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TargetRefused("its host does not resolve") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not settings.GPUMARKET_WEBHOOK_ALLOW_PRIVATE:
        for address in addresses:
            if not _public(address):
                raise TargetRefused(f"its host resolves to a private or loopback address "
                                    f"({address}): only public addresses are allowed")
    if not addresses:
        raise TargetRefused("its host does not resolve")
    return addresses


def check(url: str) -> list[str]:
    """parse + resolve: the URL's allowed addresses, or TargetRefused."""
    return resolve(parse(url))


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast
