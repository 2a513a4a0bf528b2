"""POST /api/v1/nodes/<id>/retire/ (marketplace/node_retire.py): 200 with the node
(`retired_at` set) and `cancelled_asks` (ids); 409 naming `node` while it has an active
lease or an open sealed-bid auction, nothing changed; 404 for a node not yours. Your API
token or session only (a runner token cannot retire its node). No body. Renaming and the
rest of the node endpoints: providers/api.py."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace import node_retire
from providers.api import NodeSerializer

RetiredOut = inline_serializer("NodeRetired", {
    "node": NodeSerializer(),
    "cancelled_asks": serializers.ListField(child=serializers.IntegerField()),
})


class NodeRetire(APIView):
    @extend_schema(request=None, responses={200: RetiredOut})
    def post(self, request, pk: int):
        retired = node_retire.retire_node(user_id=request.user.pk, node_id=pk)
        return Response({"node": NodeSerializer(retired.node).data,
                         "cancelled_asks": retired.cancelled_asks})
