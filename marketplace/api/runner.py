"""The runner's lease endpoints (docs/RUNNER_PROTOCOL.md): list the node's unended
leases; report starting / running / completed / failed; send the container's log tail.
Also the buyer's and provider's view of that tail (GET /api/v1/leases/<id>/logs/)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictCharField, StrictIntegerField
from marketplace import checkpoints, lease_end, lease_notice, selectors
from marketplace import leases as lease_services
from marketplace.errors import NotFound
from marketplace.jupyter import JUPYTER_SECRET, jupyter_token
from marketplace.models import Lease
from marketplace.sealing import Unsealable, unseal
from providers import services as provider_services
from providers.api import RunnerView
from providers.models import LeaseLog
from providers.runner.logtail import redact

log = logging.getLogger("gpumarket.runner_api")


def runner_secrets(lease: Lease) -> dict[str, str]:
    """The lease's secrets in clear, with its Jupyter token as JUPYTER_TOKEN (which wins
    over a buyer's own): for this lease's runner only. Raises sealing.Unsealable."""
    values = unseal(lease.secrets_sealed)
    token = jupyter_token(lease) if lease.jupyter_token_sealed else ""
    if token:
        values[JUPYTER_SECRET] = token
    return values


def without_secrets(lease: Lease, text: str) -> str:
    """`text` from the runner (a log tail, a cause) with the lease's secret values
    redacted, as the runner itself does (logtail.redact): a second guard, for a runner
    that did not."""
    if not text or not (lease.secrets_sealed or lease.jupyter_token_sealed):
        return text
    try:
        return redact(text, runner_secrets(lease).values())
    except Unsealable:
        return text


def runner_lease(lease: Lease) -> dict:
    """The lease as its runner sees it (docs/RUNNER_PROTOCOL.md): the only answer that
    carries `secrets` in clear. Raises sealing.Unsealable when they cannot be opened."""
    return {
        "id": lease.pk,
        "status": lease.status,
        "image": lease.image,
        "command": lease.command,
        "gpu_uuids": lease_services.gpu_uuids(lease),
        # the bid's env (a template's defaults, the buyer's values); GPUMARKET_LEASE_ID is
        # the marketplace's (no bid may name it)
        "env": {**(lease.env or {}), "GPUMARKET_LEASE_ID": str(lease.pk)},
        # decrypted for this runner only; never logged, never in another answer
        "secrets": runner_secrets(lease),
        "duration_seconds": lease.duration_seconds,
        "started_at": lease.started_at.isoformat() if lease.started_at else None,
        "ends_at": lease.ends_at.isoformat() if lease.ends_at else None,
        # set when an interruptible lease was outbid: the marketplace ends it then (the
        # lease leaves this list and the runner stops its container); for the runner's log
        "preempt_at": lease.preempt_at.isoformat() if lease.preempt_at else None,
        # container TCP ports to publish on the provider's public host (may be [])
        "ports": list(lease.ports or []),
        # container port (string key) → "ssh" | "jupyter" | "http"; every key is in ports
        "port_roles": dict(lease.port_roles or {}),
        # the buyer's SSH public keys copied at lease creation (empty: no ssh); the runner
        # mounts them read-only as the container's authorized_keys
        "ssh_authorized_keys": list(lease.ssh_public_keys or []),
        # a buyer's stop ends the lease at once (it leaves this list), so a listed lease
        # is never stop_requested today; a runner stops a workload whose lease says true
        "stop_requested": False,
        # a deadline the lease did not have, for its workload (docs/LEASE_CONTRACT.md):
        # null or {reason, deadline, since}; the runner writes it to /run/gpumarket/notice
        "notice": lease_notice.runner_notice(lease),
        "notice_signal": lease.notice_signal,
        "stop_grace_seconds": lease.stop_grace_seconds,
        # issue 15: the chain's id (the first lease's), and the bid's checkpoint store
        # with its credentials in clear (checkpoints.runner_payload) or null
        "chain_id": lease.chain,
        "checkpoint": checkpoints.runner_payload(lease),
    }


class RunnerNoticeOut(serializers.Serializer):
    reason = serializers.CharField()
    deadline = serializers.DateTimeField()
    since = serializers.DateTimeField()


class RunnerLeaseOut(serializers.Serializer):
    """A lease as its runner sees it (runner_lease)."""

    id = serializers.IntegerField()
    status = serializers.CharField()
    image = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField(), allow_null=True)
    gpu_uuids = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    secrets = serializers.DictField(child=serializers.CharField())
    duration_seconds = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)
    ends_at = serializers.DateTimeField(allow_null=True)
    preempt_at = serializers.DateTimeField(allow_null=True)
    ports = serializers.ListField(child=serializers.IntegerField())
    port_roles = serializers.DictField(child=serializers.CharField())
    ssh_authorized_keys = serializers.ListField(child=serializers.CharField())
    stop_requested = serializers.BooleanField()
    notice = RunnerNoticeOut(allow_null=True)
    notice_signal = serializers.CharField(allow_blank=True)
    stop_grace_seconds = serializers.IntegerField()
    chain_id = serializers.IntegerField()
    checkpoint = serializers.DictField(allow_null=True)


class RunnerLeasesOut(serializers.Serializer):
    leases = RunnerLeaseOut(many=True)


class RunnerLeases(RunnerView):
    """The node's unended leases (all of them: a node has few; not paginated)."""

    @extend_schema(responses=RunnerLeasesOut)
    def get(self, request):
        active = Lease.objects.filter(node=request.auth, status__in=Lease.ACTIVE).order_by("pk")
        listed = []
        for lease in active:
            try:
                listed.append(runner_lease(lease))
            except Unsealable:  # never started without its secrets; no content logged
                log.error("lease %s left out of node %s's list: its secrets cannot be "
                          "opened with GPUMARKET_SECRETS_KEY", lease.pk, lease.node_id)
        return Response({"leases": listed})


class EndpointIn(serializers.Serializer):
    container_port = StrictIntegerField(min_value=1, max_value=65535)
    host = StrictCharField(max_length=253)
    host_port = StrictIntegerField(min_value=1, max_value=65535)


class LeaseEventIn(serializers.Serializer):
    status = serializers.ChoiceField(choices=["starting", "running", "completed", "failed"])
    container_id = StrictCharField(max_length=100, required=False, allow_blank=True,
                                   default="")
    cause = StrictCharField(max_length=300, required=False, allow_blank=True, default="")
    usage_seconds = StrictIntegerField(min_value=0, required=False, allow_null=True)
    # with `running`: where each published port is reached (ports.clean_endpoints)
    endpoints = EndpointIn(many=True, required=False, allow_null=True, default=None,
                           max_length=8)


class RunnerLeaseEvent(RunnerView):
    """The runner reports a lease's progress; the answer is the lease as it is now."""

    @extend_schema(request=LeaseEventIn, responses=RunnerLeaseOut)
    def post(self, request, pk: int):
        data = LeaseEventIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        lease = Lease.objects.filter(pk=pk, node=request.auth).first()
        if lease is None:
            raise NotFound(f"no lease {pk} on this node", field="lease")
        if v["status"] == "starting":  # a cause with it: the runner's progress (pulls)
            lease = lease_services.mark_starting(lease=lease, container_id=v["container_id"],
                                                 progress=without_secrets(lease, v["cause"]))
        elif v["status"] == "running":
            if not v["container_id"]:
                raise serializers.ValidationError({"container_id": "is required for running"})
            lease = lease_services.mark_running(lease=lease, container_id=v["container_id"],
                                                endpoints=v["endpoints"])
        else:
            if v["status"] == "failed":
                default = "the runner reported a failure"
            elif lease.ends_at and timezone.now() < lease.ends_at - timedelta(seconds=2):
                default = "the container exited by itself before the lease time was over"
            else:
                default = "lease time is over"
            lease = lease_end.end_lease(
                lease_id=lease.pk, status=v["status"],
                cause=without_secrets(lease, v["cause"]) or default,
                detail={"runner_usage_seconds": v.get("usage_seconds")},
            )
        return Response(runner_lease(lease))


class LeaseLogIn(serializers.Serializer):
    # the 64 KiB bound is in UTF-8 bytes, checked by providers.services.lease_log_record
    tail = StrictCharField(allow_blank=True, trim_whitespace=False,
                           max_length=LeaseLog.MAX_BYTES)


class LeaseLogOut(serializers.Serializer):
    lease = serializers.IntegerField()
    tail = serializers.CharField()
    updated_at = serializers.DateTimeField(allow_null=True)


def lease_log_body(lease_id: int, log: LeaseLog | None) -> dict:
    return {"lease": lease_id, "tail": log.tail if log else "",
            "updated_at": log.updated_at.isoformat() if log else None}


class RunnerLeaseLogs(RunnerView):
    """The runner sends the last lines of the lease container's output (replacing the
    previous tail)."""

    @extend_schema(request=LeaseLogIn, responses=LeaseLogOut)
    def post(self, request, pk: int):
        data = LeaseLogIn(data=request.data)
        data.is_valid(raise_exception=True)
        lease = Lease.objects.filter(pk=pk, node=request.auth).first()
        if lease is None:
            raise NotFound(f"no lease {pk} on this node", field="lease")
        tail = without_secrets(lease, data.validated_data["tail"])
        log = provider_services.lease_log_record(node=request.auth, lease_id=pk, tail=tail)
        return Response(lease_log_body(pk, log))


class LeaseLogs(APIView):
    """The latest tail of the lease container's output, as its runner last sent it; only
    for the lease's buyer and provider (404 for anyone else)."""

    @extend_schema(responses=LeaseLogOut)
    def get(self, request, pk: int):
        user = request.user
        if not selectors.user_leases(user.pk).filter(pk=pk).exists():
            raise NotFound(f"no lease {pk} of yours")  # the URL's, no field: as every lease 404
        return Response(lease_log_body(pk, LeaseLog.objects.filter(lease_id=pk).first()))
