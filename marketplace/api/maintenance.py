"""A node's maintenance windows (marketplace/maintenance.py): GET and POST
/api/v1/nodes/<id>/maintenance/, DELETE /api/v1/nodes/<id>/maintenance/<window id>/. The
node's provider only: another's node is a 404, as a missing one."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictCharField, StrictInputSerializer
from marketplace import maintenance
from marketplace.api.views import own_node
from providers.models import MaintenanceWindow


class MaintenanceWindowIn(StrictInputSerializer):
    """starts_at (at least the notice period ahead), ends_at (after it), reason
    (optional, shown to the node's buyers in their lease's events)."""

    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    reason = StrictCharField(max_length=200, required=False, allow_blank=True, default="")


class MaintenanceWindowOut(serializers.ModelSerializer):
    class Meta:
        model = MaintenanceWindow
        fields = ["id", "node", "starts_at", "ends_at", "reason", "created_at"]


class NodeMaintenanceOut(serializers.Serializer):
    """A node's windows not yet over, by start (few: not paginated)."""

    node = serializers.IntegerField()
    windows = MaintenanceWindowOut(many=True)


class NodeMaintenance(APIView):
    """Your node's maintenance windows not yet over, {node, windows} by start; POST
    announces one: its asks stop selling time that overlaps it, the leases that would
    overlap get their notice at starts_at minus the notice period and end at starts_at.
    400 naming the field for a start too soon, an end not after the start, an overlap
    with another window."""

    @extend_schema(responses=NodeMaintenanceOut)
    def get(self, request, pk: int):
        own_node(request, pk)
        windows = maintenance.upcoming([pk]).get(pk, [])
        return Response({"node": pk,
                         "windows": MaintenanceWindowOut(windows, many=True).data})

    @extend_schema(request=MaintenanceWindowIn, responses={201: MaintenanceWindowOut})
    def post(self, request, pk: int):
        own_node(request, pk)
        data = MaintenanceWindowIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        window = maintenance.announce(user_id=request.user.pk, node_id=pk,
                                      starts_at=v["starts_at"], ends_at=v["ends_at"],
                                      reason=v["reason"])
        return Response(MaintenanceWindowOut(window).data, status=201)


class NodeMaintenanceWindow(APIView):
    """Withdraw a window not yet over (204): its notices are taken back, the asks sell its
    time again. 409 for a window that is over."""

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int, window_id: int):
        own_node(request, pk)
        maintenance.withdraw(user_id=request.user.pk, node_id=pk, window_id=window_id)
        return Response(status=204)
