"""This process's feed hubs, one per event loop (frontend/feed/hub.py makes them): where
the in-memory channel layer delivers, and whose user groups count as listening."""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frontend.feed.hub import Hub

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()
