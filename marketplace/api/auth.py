"""User API tokens (marketplace/api_tokens.py: hashed at rest, expiring, revocable):
programs send `Authorization: Token <key>` or the more common `Authorization: Bearer <key>`.
A refused token is a 401 whose detail says why ("invalid token", "token expired").
Runner tokens (`gmr_…`) are a different credential, accepted only on the runner
endpoints (providers/auth.py)."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from marketplace import api_tokens


class ApiTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`; request.user the token's user, request.auth the
    ApiToken row. Header parsing (and its messages) is DRF's."""

    keyword = "Token"

    def authenticate_credentials(self, key: str):
        try:
            token = api_tokens.authenticate(key)
        except api_tokens.TokenRefused as exc:
            raise exceptions.AuthenticationFailed(exc.message) from None
        return token.user, token


class BearerTokenAuthentication(ApiTokenAuthentication):
    keyword = "Bearer"
