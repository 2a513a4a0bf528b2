"""The runner's lease endpoints (docs/RUNNER_PROTOCOL.md): list the node's unended
leases; report starting / running / completed / failed."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from marketplace import leases as lease_services
from marketplace.errors import NotFound
from marketplace.models import Lease
from providers.api import RunnerView


def runner_lease(lease: Lease) -> dict:
    return {
        "id": lease.pk,
        "status": lease.status,
        "image": lease.image,
        "command": lease.command,
        "gpu_uuids": lease_services.gpu_uuids(lease),
        "env": {"GPUMARKET_LEASE_ID": str(lease.pk)},
        "duration_seconds": lease.duration_seconds,
        "started_at": lease.started_at.isoformat() if lease.started_at else None,
        "ends_at": lease.ends_at.isoformat() if lease.ends_at else None,
    }


class RunnerLeases(RunnerView):
    def get(self, request):
        active = Lease.objects.filter(node=request.auth, status__in=Lease.ACTIVE).order_by("pk")
        return Response({"leases": [runner_lease(lease) for lease in active]})


class LeaseEventIn(serializers.Serializer):
    status = serializers.ChoiceField(choices=["starting", "running", "completed", "failed"])
    container_id = serializers.CharField(max_length=100, required=False, allow_blank=True,
                                         default="")
    cause = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    usage_seconds = serializers.IntegerField(min_value=0, required=False, allow_null=True)


class RunnerLeaseEvent(RunnerView):
    @extend_schema(request=LeaseEventIn)
    def post(self, request, pk: int):
        data = LeaseEventIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        lease = Lease.objects.filter(pk=pk, node=request.auth).first()
        if lease is None:
            raise NotFound(f"no lease {pk} on this node", field="lease")
        if v["status"] == "starting":
            lease = lease_services.mark_starting(lease=lease, container_id=v["container_id"])
        elif v["status"] == "running":
            if not v["container_id"]:
                raise serializers.ValidationError({"container_id": "is required for running"})
            lease = lease_services.mark_running(lease=lease, container_id=v["container_id"])
        else:
            if v["status"] == "failed":
                default = "the runner reported a failure"
            elif lease.ends_at and timezone.now() < lease.ends_at - timedelta(seconds=2):
                default = "the container exited by itself before the lease time was over"
            else:
                default = "lease time is over"
            lease = lease_services.end_lease(
                lease_id=lease.pk, status=v["status"], cause=v["cause"] or default,
                detail={"runner_usage_seconds": v.get("usage_seconds")},
            )
        return Response(runner_lease(lease))
