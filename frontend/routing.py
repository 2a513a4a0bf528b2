"""Websocket routes. The live auction feed (/ws/markets/…, /ws/auctions/…, /ws/me/)
is issue 6's; until then no websocket route is served."""

websocket_urlpatterns: list = []
