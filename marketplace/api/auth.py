"""Programs may send their API token as `Authorization: Token <key>` (DRF's keyword) or
the more common `Authorization: Bearer <key>`. Runner tokens (`gmr_…`) are a different
credential, accepted only on the runner endpoints."""

from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"
