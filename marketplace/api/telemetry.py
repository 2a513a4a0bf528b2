"""Per-lease telemetry over HTTP (docs/TELEMETRY.md): the runner's heartbeat with its
`telemetry` items (providers' heartbeat, then marketplace/telemetry.record), and the
buyer's `GET /api/v1/leases/<id>/metrics/?range=1h|24h`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace import telemetry
from marketplace.api import heartbeat_batch  # its record(): one beat alone
from marketplace.errors import MarketError, NotFound
from marketplace.models import Lease
from providers import api as providers_api


class HeartbeatIn(providers_api.HeartbeatIn):
    """providers' heartbeat, plus `telemetry`: per running lease, its GPUs' readings
    ([{"lease": id, "gpus": [{uuid, utilization_pct, fb_used_mib, power_w, temperature_c,
    sm_clock_mhz, mem_clock_mhz, throttle_reasons}]}]); each item is checked by
    telemetry.record, a bad one refused alone."""

    telemetry = serializers.ListField(child=serializers.JSONField(), required=False,
                                      default=list, max_length=telemetry.MAX_LEASES)
    # what the node's engine holds (docs/IMAGES.md), sent when it changed: [{image, bytes}]
    images = serializers.JSONField(required=False, default=None)


class HeartbeatOut(providers_api.HeartbeatOut):
    telemetry_errors = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="present when telemetry readings were refused: each names the item, "
                  "field and why; the rest of the heartbeat applied")


class RunnerHeartbeat(providers_api.RunnerView):
    """POST /api/v1/runner/heartbeat/ (docs/RUNNER_PROTOCOL.md)."""

    @extend_schema(request=HeartbeatIn, responses=HeartbeatOut)
    def post(self, request):
        data = HeartbeatIn(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(heartbeat_batch.record(request.auth, dict(data.validated_data)))


class GpuSeriesOut(serializers.Serializer):
    """One GPU's buckets, in columns (one value per `at`; null where unknown)."""

    uuid = serializers.CharField()
    at = serializers.ListField(child=serializers.DateTimeField())
    utilization_pct = serializers.ListField(child=serializers.FloatField(allow_null=True))
    fb_used_mib = serializers.ListField(child=serializers.FloatField(allow_null=True))
    power_w = serializers.ListField(child=serializers.FloatField(allow_null=True))
    temperature_c = serializers.ListField(child=serializers.FloatField(allow_null=True))
    sm_clock_mhz = serializers.ListField(child=serializers.FloatField(allow_null=True))
    mem_clock_mhz = serializers.ListField(child=serializers.FloatField(allow_null=True))
    throttle_reasons = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField()))


class LeaseMetricsOut(serializers.Serializer):
    lease = serializers.IntegerField()
    range = serializers.ChoiceField(choices=list(telemetry.RANGES))
    resolution_seconds = serializers.IntegerField()
    gpus = GpuSeriesOut(many=True)
    idle = serializers.DictField(allow_null=True, help_text="telemetry.idle_states: null "
                                 "when the lease is not running or has no readings")


class LeaseMetrics(APIView):
    """The lease's GPU telemetry, for its buyer only (anyone else, its provider too:
    404 as a missing lease; a provider reads its GPUs' counters on the node page)."""

    @extend_schema(parameters=[OpenApiParameter("range", str, enum=list(telemetry.RANGES))],
                   responses=LeaseMetricsOut)
    def get(self, request, pk: int):
        lease = Lease.objects.filter(pk=pk, buyer_id=request.user.pk).first()
        if lease is None:
            raise NotFound(f"no lease {pk} of yours")
        range_ = request.query_params.get("range", "1h")
        unknown = sorted(set(request.query_params) - {"range"})
        if unknown:
            raise MarketError("is not a known parameter", field=unknown[0])
        if range_ not in telemetry.RANGES:
            raise MarketError(f"must be one of {', '.join(telemetry.RANGES)}", field="range")
        return Response(telemetry.series(lease, range_))
