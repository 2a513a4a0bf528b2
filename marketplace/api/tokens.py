"""Your API tokens and websocket tickets (marketplace/api_tokens.py).

- GET /api/v1/auth/tokens/: your tokens (newest first; the API's one list shape): id,
  name, prefix (the first characters, to recognise one), created_at, last_used_at (to
  about a minute), expires_at, expired, current (the one this request authenticated
  with) — never a token itself.
- DELETE /api/v1/auth/tokens/<id>/: revoke one (200 `{"id": <id>, "revoked": true}`):
  refused from then on, at once; the websocket tickets it asked for go with it. Another
  user's id is a 404.
- POST /api/v1/ws-tickets/: `{ticket, expires_at}`, a single-use ticket for
  `/ws/me/?ticket=<ticket>`, valid GPUMARKET_WS_TICKET_SECONDS (30 s): the websocket
  credential for programs and pages on another origin (browsers cannot set headers on a
  websocket; a token in a URL would land in access logs).
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from core.pagination import Pagination
from marketplace import api_tokens
from marketplace.models import ApiToken


class ApiTokenOut(serializers.ModelSerializer):
    expired = serializers.SerializerMethodField()
    current = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "expires_at",
                  "expired", "current"]

    def get_expired(self, token: ApiToken) -> bool:
        return token.expires_at <= self.context["now"]

    def get_current(self, token: ApiToken) -> bool:
        auth = self.context["auth"]
        return isinstance(auth, ApiToken) and auth.pk == token.pk


class TokenList(generics.ListAPIView):
    """Your API tokens, newest first (never the tokens themselves)."""

    pagination_class = Pagination
    serializer_class = ApiTokenOut

    def get_queryset(self):
        return ApiToken.objects.filter(user=self.request.user)

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "now": timezone.now(),
                "auth": self.request.auth}


class RevokedOut(serializers.Serializer):
    id = serializers.IntegerField()
    revoked = serializers.BooleanField()


class TokenRevoke(APIView):
    """Revoke one of your API tokens: refused from now on (also the one you call with)."""

    @extend_schema(request=None, responses={200: RevokedOut})
    def delete(self, request, pk: int):
        deleted, _ = ApiToken.objects.filter(pk=pk, user=request.user).delete()
        if not deleted:
            raise NotFound(f"you have no API token {pk}")
        return Response({"id": pk, "revoked": True})


class WsTicketOut(serializers.Serializer):
    ticket = serializers.CharField(help_text="for /ws/me/?ticket=<ticket>: one connection")
    expires_at = serializers.DateTimeField()


class WsTicketCreate(APIView):
    """A single-use websocket ticket for /ws/me/ (valid GPUMARKET_WS_TICKET_SECONDS)."""

    @extend_schema(request=None, responses={201: WsTicketOut})
    def post(self, request):
        api_token = request.auth if isinstance(request.auth, ApiToken) else None
        ticket, expires_at = api_tokens.issue_ticket(user=request.user, api_token=api_token)
        return Response({"ticket": ticket, "expires_at": expires_at}, status=201)
