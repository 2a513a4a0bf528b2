"""ASGI entry point: HTTP through Django (a bid placed with an API token first through
the bid batcher, marketplace/api/bid_batcher.py; a runner's heartbeat through
marketplace/api/heartbeat_path.py); websockets through Channels (the
live feed, frontend/routing.py): session authentication, an Origin in ALLOWED_HOSTS, and
no credential in the URL (frontend/ws_auth.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from frontend.routing import websocket_urlpatterns  # noqa: E402
from frontend.ws_auth import RefuseCredentialsInUrl  # noqa: E402
from marketplace.api.bid_batcher import BidFastPath  # noqa: E402
from marketplace.api.heartbeat_path import HeartbeatFastPath  # noqa: E402

application = ProtocolTypeRouter({
    # token-authenticated bids go to the batcher (group commit), runners' valid
    # heartbeats to the heartbeat threads; the rest to Django
    "http": BidFastPath(HeartbeatFastPath(django_asgi_app)),
    "websocket": AllowedHostsOriginValidator(RefuseCredentialsInUrl(
        AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
})
