"""Alert rules API (docs/WEBHOOKS.md, "Alert rules"):

- GET /api/v1/alert-rules/: {count, next, previous, results: [rule]} (core.pagination),
  oldest first; POST {"expression", "name"?} → 201 rule.
  rule = {id, name, expression, conditions: [{metric, op, threshold, for_seconds}],
  enabled, created_at, incidents: [{subject, values, fired_at, resolved_at}] (latest 20)}.
  An expression that does not parse is a 400 naming `expression` and the position.
- GET / DELETE /api/v1/alert-rules/<id>/ (another user's or a missing id: 404).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from alerts import rules, services
from alerts.models import AlertIncident, AlertRule
from core.fields import StrictCharField, StrictInputSerializer
from core.pagination import Pagination, paginated


class AlertIncidentOut(serializers.ModelSerializer):
    class Meta:
        model = AlertIncident
        fields = ["subject", "values", "fired_at", "resolved_at"]


class AlertRuleOut(serializers.ModelSerializer):
    incidents = serializers.SerializerMethodField()

    class Meta:
        model = AlertRule
        fields = ["id", "name", "expression", "conditions", "enabled", "created_at",
                  "incidents"]

    def get_incidents(self, rule) -> list[dict]:
        return AlertIncidentOut(rule.incidents.all()[:20], many=True).data


class AlertRuleIn(StrictInputSerializer):
    expression = StrictCharField(max_length=rules.MAX_CHARS, help_text=(
        "conditions joined by AND: METRIC OP NUMBER [UNIT] [FOR 30m], e.g. "
        "`gpu_utilization < 5% FOR 30m AND lease_cost > 50 USD`; metrics: "
        + ", ".join(rules.METRICS)))
    name = StrictCharField(required=False, allow_blank=True, max_length=100)


class AlertRuleList(APIView):
    """List or add your alert rules."""

    pagination_class = Pagination  # for the schema; the answer is paginated() below

    @extend_schema(responses=AlertRuleOut(many=True), operation_id="alert_rules_list")
    def get(self, request):
        found = AlertRule.objects.filter(user=request.user).order_by("pk")
        return paginated(self, request, found, AlertRuleOut)

    @extend_schema(request=AlertRuleIn, responses={201: AlertRuleOut})
    def post(self, request):
        data = AlertRuleIn(data=request.data)
        data.is_valid(raise_exception=True)
        rule = services.create_rule(user_id=request.user.pk, **data.validated_data)
        return Response(AlertRuleOut(rule).data, status=201)


class AlertRuleDetail(APIView):
    """One of your alert rules, with its latest incidents; or delete it."""

    @extend_schema(responses=AlertRuleOut)
    def get(self, request, pk: int):
        return Response(AlertRuleOut(services.rule_of(user_id=request.user.pk,
                                                      rule_id=pk)).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        services.delete_rule(user_id=request.user.pk, rule_id=pk)
        return Response(status=204)
