"""The webhooks API (docs/WEBHOOKS.md):

- GET /api/v1/webhooks/: {count, next, previous, results: [endpoint]} (core.pagination),
  oldest first; POST {"url", "events": [type]} → 201
  with the endpoint and its `secret` (`whsec_…`), shown this once and never again.
  endpoint = {id, url, events, enabled, created_at}.
- GET / PATCH {url?, events?, enabled?} / DELETE /api/v1/webhooks/<id>/ (another user's
  or a missing id: 404).
- GET /api/v1/webhooks/<id>/deliveries/: the delivery log, newest first, paginated:
  {event_id, type, status, attempts, last_status_code, latency_ms, last_error,
  next_attempt_at, last_attempt_at, delivered_at, created_at}.
- POST /api/v1/webhooks/<id>/test/: 202 {"event_id"}: a `webhook.test` event to it.
A URL that is not http(s), carries credentials or resolves to a private address, or an
unknown event type, is a 400 naming `url` / `events`.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictBooleanField, StrictCharField, StrictInputSerializer
from core.pagination import Pagination, paginated
from webhooks import services, targets
from webhooks.models import WebhookDelivery, WebhookEndpoint


class WebhookEndpointOut(serializers.ModelSerializer):
    events = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "enabled", "created_at"]


class WebhookEndpointCreatedOut(WebhookEndpointOut):
    secret = serializers.CharField(help_text="the signing secret: shown this once")

    class Meta(WebhookEndpointOut.Meta):
        fields = [*WebhookEndpointOut.Meta.fields, "secret"]


class WebhookEventsField(serializers.ListField):
    child = StrictCharField(max_length=64)
    max_length = 64

    def to_internal_value(self, data):
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        return super().to_internal_value(data)


class WebhookEndpointIn(StrictInputSerializer):
    url = StrictCharField(max_length=targets.MAX_URL_CHARS, trim_whitespace=False,
                          help_text="an http(s) URL whose host resolves to a public address")
    events = WebhookEventsField(help_text=f"event types: {', '.join(services.SUBSCRIBABLE)}")


class WebhookEndpointPatch(StrictInputSerializer):
    url = StrictCharField(required=False, max_length=targets.MAX_URL_CHARS,
                          trim_whitespace=False)
    events = WebhookEventsField(required=False)
    enabled = StrictBooleanField(required=False)


class WebhookDeliveryOut(serializers.ModelSerializer):
    event_id = serializers.CharField()
    type = serializers.CharField(source="event.type")

    class Meta:
        model = WebhookDelivery
        fields = ["event_id", "type", "status", "attempts", "last_status_code", "latency_ms",
                  "last_error", "next_attempt_at", "last_attempt_at", "delivered_at",
                  "created_at"]


class WebhookTestOut(serializers.Serializer):
    event_id = serializers.CharField()


class EndpointList(APIView):
    """List or register your webhook endpoints."""

    pagination_class = Pagination  # for the schema; the answer is paginated() below

    @extend_schema(responses=WebhookEndpointOut(many=True), operation_id="webhooks_list")
    def get(self, request):
        endpoints = WebhookEndpoint.objects.filter(user=request.user).order_by("pk")
        return paginated(self, request, endpoints, WebhookEndpointOut)

    @extend_schema(request=WebhookEndpointIn, responses={201: WebhookEndpointCreatedOut})
    def post(self, request):
        data = WebhookEndpointIn(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint, secret = services.create_endpoint(user_id=request.user.pk,
                                                    **data.validated_data)
        endpoint.secret = secret
        return Response(WebhookEndpointCreatedOut(endpoint).data, status=201)


class EndpointDetail(APIView):
    """One of your webhook endpoints: read, change or delete it."""

    @extend_schema(responses=WebhookEndpointOut)
    def get(self, request, pk: int):
        endpoint = services.endpoint_of(user_id=request.user.pk, endpoint_id=pk)
        return Response(WebhookEndpointOut(endpoint).data)

    @extend_schema(request=WebhookEndpointPatch, responses=WebhookEndpointOut)
    def patch(self, request, pk: int):
        data = WebhookEndpointPatch(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = services.update_endpoint(user_id=request.user.pk, endpoint_id=pk,
                                            **data.validated_data)
        return Response(WebhookEndpointOut(endpoint).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        services.delete_endpoint(user_id=request.user.pk, endpoint_id=pk)
        return Response(status=204)


class EndpointDeliveries(APIView):
    """The delivery log of one of your endpoints, newest first."""

    pagination_class = Pagination

    @extend_schema(responses=WebhookDeliveryOut(many=True))
    def get(self, request, pk: int):
        endpoint = services.endpoint_of(user_id=request.user.pk, endpoint_id=pk)
        return paginated(self, request, endpoint.deliveries.select_related("event"),
                         WebhookDeliveryOut)


class EndpointTest(APIView):
    """Send a `webhook.test` event to one of your endpoints."""

    @extend_schema(request=None, responses={202: WebhookTestOut})
    def post(self, request, pk: int):
        event = services.send_test(user_id=request.user.pk, endpoint_id=pk)
        return Response({"event_id": event.id}, status=202)
