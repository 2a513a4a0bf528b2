"""GET /api/v1/nodes/<id>/reliability/: a node's reliability record and its provider's
(marketplace/reliability.py, docs/FAULTS.md), for the node's provider (404 for anyone
else: offers show every node's 30-day figure anonymously)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace import reliability
from marketplace.errors import NotFound
from providers.models import Node


class RecordOut(serializers.Serializer):
    days = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="failed by a provider-side cause")
    reliability = serializers.CharField(allow_null=True, help_text='"0.950"; null: no record')
    recover_seconds = serializers.IntegerField(
        allow_null=True, help_text="median seconds from such a failure to its continuation "
                                   "running; null: none")


class NodeReliabilityOut(serializers.Serializer):
    node = serializers.IntegerField()
    records = RecordOut(many=True)
    provider = RecordOut(many=True, help_text="all of the provider's nodes together")


class NodeReliability(APIView):
    @extend_schema(responses=NodeReliabilityOut)
    def get(self, request, pk: int):
        node = Node.objects.select_related("provider").filter(
            pk=pk, provider__user_id=request.user.pk).first()
        if node is None:
            raise NotFound(f"no node {pk} of yours")
        return Response({"node": node.pk, "records": reliability.records(node_id=node.pk),
                         "provider": reliability.records(provider_id=request.user.pk)})
