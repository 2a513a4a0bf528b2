"""No credential in a websocket URL (marketplace/asgi.py puts this in front of every
websocket route: the feeds and the runner's /ws/runner/).

A URL is written to access logs, proxies' logs and browser history, so `?token=` (or
`access_token`, `api_key`, `key`, `password`) is refused on every websocket path: the
connection is accepted, told why in one JSON frame
(`{"type": "error", "detail": "…"}`), and closed with code 4400 and the same reason.
What to use instead: the session cookie (pages), a single-use ticket from
POST /api/v1/ws-tickets/ (`/ws/me/?ticket=…`), or an `Authorization: Token|Bearer <key>`
header (programs; the runner sends its runner token so).
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

CLOSE_CREDENTIALS_IN_URL = 4400
REFUSED_PARAMS = frozenset({"token", "access_token", "api_key", "apikey", "key", "password",
                            "auth", "authorization"})
REASON = ("credentials in the URL are refused: use a ticket from POST /api/v1/ws-tickets/ "
          "or an Authorization header")


def credential_param(query_string: bytes) -> str | None:
    """The first credential-like parameter name in a query string, else None."""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    for name, _ in pairs:
        if name.lower() in REFUSED_PARAMS:
            return name
    return None


class RefuseCredentialsInUrl:
    """ASGI middleware: websockets with a credential in the query string are refused
    (see the module doc); everything else goes on to `app` unchanged."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        name = credential_param(scope.get("query_string", b""))
        if name is None:
            return await self.app(scope, receive, send)
        message = await receive()
        if message["type"] != "websocket.connect":
            return None
        detail = f"'{name}' in the URL: {REASON}"
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send",
                    "text": json.dumps({"type": "error", "detail": detail})})
        await send({"type": "websocket.close", "code": CLOSE_CREDENTIALS_IN_URL,
                    "reason": REASON})
        return None
