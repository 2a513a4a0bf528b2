"""POST /api/v1/runner/leases/<id>/checkpoints/: the runner reports one checkpoint
upload or restore of a lease of its node (also after the lease ended: the upload at the
end comes after the final event). Stored as a lease event note
(marketplace/checkpoint_reports.py); the answer is the lease's `checkpoints`."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from core.fields import (
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNumberField,
)
from marketplace import checkpoint_reports
from marketplace.api.runner import without_secrets
from marketplace.errors import NotFound
from marketplace.models import Lease
from marketplace.sealing import Unsealable, unseal
from providers.api import RunnerView
from providers.runner.logtail import redact


class CheckpointReportIn(StrictInputSerializer):
    """One report: status, reason (checkpoint_reports), at (when it finished), bytes and
    files moved, seconds it took, key (the manifest's object key), message (why it
    failed; secrets redacted again here)."""

    status = serializers.ChoiceField(choices=checkpoint_reports.STATUSES)
    reason = serializers.ChoiceField(choices=checkpoint_reports.REASONS)
    at = serializers.DateTimeField()
    bytes = StrictIntegerField(min_value=0, max_value=2**62, required=False, default=0)
    files = StrictIntegerField(min_value=0, max_value=10**9, required=False, default=0)
    seconds = StrictNumberField(min_value=0, max_value=10**7, required=False, default=0)
    key = StrictCharField(max_length=1024, required=False, allow_blank=True, default="")
    message = StrictCharField(max_length=300, required=False, allow_blank=True, default="")


def _redacted(lease: Lease, text: str) -> str:
    """`text` without the lease's secrets and its store's credentials (the runner redacts
    them too: a second guard)."""
    text = without_secrets(lease, text)
    try:
        values = unseal(lease.checkpoint_sealed).values()
    except Unsealable:
        return text
    return redact(text, values) if text else text


class RunnerCheckpointReport(RunnerView):
    """Record a checkpoint report of a lease of this node."""

    @extend_schema(request=CheckpointReportIn, responses={200: dict})
    def post(self, request, pk: int):
        data = CheckpointReportIn(data=request.data)
        data.is_valid(raise_exception=True)
        lease = Lease.objects.filter(pk=pk, node=request.auth).first()
        if lease is None:
            raise NotFound(f"no lease {pk} on this node", field="lease")
        report = dict(data.validated_data)
        report["seconds"] = round(report["seconds"], 3)
        report["message"] = _redacted(lease, report["message"])
        checkpoint_reports.record(lease, report)
        return Response({"lease": lease.pk, "checkpoints": checkpoint_reports.listed(lease)})
