"""The webhooks API (docs/WEBHOOKS.md):

- GET /api/v1/webhooks/: {"results": [endpoint]}; POST {"url", "events": [type]} → 201
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
from core.pagination import Pagination
from webhooks import services, targets
from webhooks.models import WebhookDelivery, WebhookEndpoint


class EndpointOut(serializers.ModelSerializer):
    events = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "enabled", "created_at"]


class EndpointCreatedOut(EndpointOut):
    secret = serializers.CharField(help_text="the signing secret: shown this once")

    class Meta(EndpointOut.Meta):
        fields = [*EndpointOut.Meta.fields, "secret"]


class EndpointsOut(serializers.Serializer):
    results = EndpointOut(many=True)


class EventsField(serializers.ListField):
    child = StrictCharField(max_length=64)
    max_length = 64

    def to_internal_value(self, data):
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        return super().to_internal_value(data)


class EndpointIn(StrictInputSerializer):
    url = StrictCharField(max_length=targets.MAX_URL_CHARS, trim_whitespace=False,
                          help_text="an http(s) URL whose host resolves to a public address")
    events = EventsField(help_text=f"event types: {', '.join(services.SUBSCRIBABLE)}")


class EndpointPatch(StrictInputSerializer):
    url = StrictCharField(required=False, max_length=targets.MAX_URL_CHARS,
                          trim_whitespace=False)
    events = EventsField(required=False)
    enabled = StrictBooleanField(required=False)


class DeliveryOut(serializers.ModelSerializer):
    event_id = serializers.CharField()
    type = serializers.CharField(source="event.type")

    class Meta:
        model = WebhookDelivery
        fields = ["event_id", "type", "status", "attempts", "last_status_code", "latency_ms",
                  "last_error", "next_attempt_at", "last_attempt_at", "delivered_at",
                  "created_at"]


class TestOut(serializers.Serializer):
    event_id = serializers.CharField()


class EndpointList(APIView):
    """List or register your webhook endpoints."""

    @extend_schema(responses=EndpointsOut)
    def get(self, request):
        endpoints = WebhookEndpoint.objects.filter(user=request.user)
        return Response({"results": EndpointOut(endpoints, many=True).data})

    @extend_schema(request=EndpointIn, responses={201: EndpointCreatedOut})
    def post(self, request):
        data = EndpointIn(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint, secret = services.create_endpoint(user_id=request.user.pk,
                                                    **data.validated_data)
        endpoint.secret = secret
        return Response(EndpointCreatedOut(endpoint).data, status=201)


class EndpointDetail(APIView):
    """One of your webhook endpoints: read, change or delete it."""

    @extend_schema(responses=EndpointOut)
    def get(self, request, pk: int):
        endpoint = services.endpoint_of(user_id=request.user.pk, endpoint_id=pk)
        return Response(EndpointOut(endpoint).data)

    @extend_schema(request=EndpointPatch, responses=EndpointOut)
    def patch(self, request, pk: int):
        data = EndpointPatch(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = services.update_endpoint(user_id=request.user.pk, endpoint_id=pk,
                                            **data.validated_data)
        return Response(EndpointOut(endpoint).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        services.delete_endpoint(user_id=request.user.pk, endpoint_id=pk)
        return Response(status=204)


class EndpointDeliveries(APIView):
    """The delivery log of one of your endpoints, newest first."""

    @extend_schema(responses=DeliveryOut(many=True))
    def get(self, request, pk: int):
        endpoint = services.endpoint_of(user_id=request.user.pk, endpoint_id=pk)
        paginator = Pagination()
        page = paginator.paginate_queryset(endpoint.deliveries.select_related("event"),
                                           request, view=self)
        return paginator.get_paginated_response(DeliveryOut(page, many=True).data)


class EndpointTest(APIView):
    """Send a `webhook.test` event to one of your endpoints."""

    @extend_schema(request=None, responses={202: TestOut})
    def post(self, request, pk: int):
        event = services.send_test(user_id=request.user.pk, endpoint_id=pk)
        return Response({"event_id": event.id}, status=202)
