"""Websocket routes of the live feed (message formats: docs/FEED_PROTOCOL.md)."""

from django.urls import path, re_path

from frontend import consumers
from marketplace import converters  # noqa: F401 (registers <gpuclass:…>)
from providers.consumers import RunnerConsumer

websocket_urlpatterns = [
    path("ws/markets/<gpuclass:gpu_class>/", consumers.MarketFeedConsumer.as_asgi()),
    path("ws/auctions/<int:auction_id>/", consumers.AuctionFeedConsumer.as_asgi()),
    path("ws/summary/", consumers.SummaryFeedConsumer.as_asgi()),
    path("ws/me/", consumers.MeFeedConsumer.as_asgi()),
    path("ws/runner/", RunnerConsumer.as_asgi()),  # runner push (providers/consumers.py)
    re_path(r"", consumers.NoSuchFeedConsumer.as_asgi()),  # anything else: 4404, not a 500
]
