"""Runner authentication: `Authorization: Bearer <runner token>`.

The token is looked up by its SHA-256 (only the hash is stored). On success
request.user is the node's provider and request.auth the Node. Any token that is not a
node's current one — never issued, replaced when the provider rotated it, or its node
retired — gets the same 401 (INVALID_TOKEN): the answer never tells which tokens exist or
existed.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from providers.models import Node
from providers.services import node_for_token

INVALID_TOKEN = ("runner token not valid: unknown, rotated by the node's provider, or its "
                 "node retired (use the node's current token)")


class RunnerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0] != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("malformed Authorization header: "
                                                  "expected 'Bearer <runner token>'")
        node = node_for_token(header[1])
        if node is None:
            raise exceptions.AuthenticationFailed(INVALID_TOKEN)
        return node.provider.user, node

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsRunner(permissions.BasePermission):
    message = "runner token required"

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Node)
