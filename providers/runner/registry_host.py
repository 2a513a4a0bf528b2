"""Which registry an image reference pulls from, and whether that registry is a private
or loopback address (docs/IMAGES.md, "Private registries"). Plain Python, no Django: the
runner refuses such pulls itself, and the marketplace (core/image_ref.py) uses the same
rule for bids.

The registry is the reference's first path component when it holds a "." or ":" or is
`localhost` (Docker's rule, distribution/reference normalize.go); otherwise Docker Hub.
A host is refused when it is `localhost` (or a name under `.localhost`, RFC 6761) or an
IP literal that is not globally routable or is multicast — loopback, private, link-local,
unspecified, shared (100.64/10), reserved; IPv4-mapped IPv6 counts as its IPv4 address;
the shorthand IPv4 forms inet_aton reads ("127.1", "0x7f.1") count too. Host names are
not resolved: the marketplace cannot know a provider's DNS view.
"""

from __future__ import annotations

import ipaddress
import re
import socket

_NUMERIC_V4 = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+)){0,3}",
                         re.ASCII)


def registry_host(ref: str) -> str | None:
    """The registry host of `ref` without port or brackets ("127.0.0.1:5000/a:1" →
    "127.0.0.1", "[::1]:5000/a" → "::1", "localhost/a" → "localhost"), or None for Docker
    Hub ("busybox", "pytorch/pytorch:2")."""
    name = ref.strip().split("@", 1)[0]
    if "/" not in name:
        return None
    first = name.split("/", 1)[0]
    if "." not in first and ":" not in first and first.lower() != "localhost":
        return None
    if first.startswith("["):
        return first[1:first.find("]")] if "]" in first else first[1:]
    return first.rsplit(":", 1)[0] if ":" in first else first


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not _NUMERIC_V4.fullmatch(host):
            return None
        try:  # "127.1", "0x7f.0.0.1", "017700000001": what the C resolver reads as IPv4
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip


def _kind(ip) -> str:
    for attr, word in (("is_loopback", "loopback"), ("is_unspecified", "unspecified"),
                       ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                       ("is_private", "private")):
        if getattr(ip, attr):
            return word
    return "non-public"


def private_registry_problem(ref: str) -> str | None:
    """Why `ref`'s registry is a private or loopback host — "registry 127.0.0.1 is a
    loopback address" — or None when it is Docker Hub, a host name, or a public IP."""
    host = registry_host(ref)
    if host is None:
        return None
    lowered = host.lower()
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return f"registry {host} is a loopback host"
    ip = _address(host)
    if ip is None or (ip.is_global and not ip.is_multicast):
        return None
    kind = _kind(ip)
    return f"registry {host} is a{'n' if kind[0] in 'aeiou' else ''} {kind} address"
