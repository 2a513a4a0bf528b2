"""Channel-layer facts shared by the runners' push notices (providers/push.py) and the
live feed (frontend/feed.py), which both publish over Redis pub/sub."""

from __future__ import annotations

from django.conf import settings


def namespace() -> str:
    """The Redis database of REDIS_URL ("" without Redis). Redis pub/sub channels are
    server-wide, not per database: a deployment (or a test run) on another database of the
    same server publishes on the same channel names with its own numbering and ids. Every
    published message carries this, and receivers drop messages of another namespace."""
    url = getattr(settings, "REDIS_URL", "")
    if not url:
        return ""
    from redis.connection import parse_url

    return str(parse_url(url).get("db", 0))


def is_local(layer) -> bool:
    """Whether `layer` is the in-memory channel layer: it reaches this process only."""
    from channels.layers import InMemoryChannelLayer

    return isinstance(layer, InMemoryChannelLayer)
