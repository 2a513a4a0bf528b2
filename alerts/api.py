"""Alert rules API (docs/WEBHOOKS.md, "Alert rules"):

- GET /api/v1/alert-rules/: {"results": [rule]}; POST {"expression", "name"?} → 201 rule.
  rule = {id, name, expression, conditions: [{metric, op, threshold, for_seconds}],
  enabled, created_at, incidents: [{subject, values, fired_at, resolved_at}] (latest 20)}.
  An expression that does not parse is a 400 naming `expression` and the position.
- GET / DELETE /api/v1/alert-rules/<id>/ (another user's or a missing id: 404).
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from alerts import rules
from alerts.models import AlertIncident, AlertRule
from core.fields import StrictCharField, StrictInputSerializer
from marketplace.errors import InvalidInput, NotFound


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


class AlertRulesOut(serializers.Serializer):
    results = AlertRuleOut(many=True)


class AlertRuleIn(StrictInputSerializer):
    expression = StrictCharField(max_length=rules.MAX_CHARS, help_text=(
        "conditions joined by AND: METRIC OP NUMBER [UNIT] [FOR 30m], e.g. "
        "`gpu_utilization < 5% FOR 30m AND lease_cost > 50 USD`; metrics: "
        + ", ".join(rules.METRICS)))
    name = StrictCharField(required=False, allow_blank=True, max_length=100)


def _rule(user_id: int, pk: int) -> AlertRule:
    rule = AlertRule.objects.filter(user_id=user_id, pk=pk).first()
    if rule is None:
        raise NotFound(f"no alert rule {pk}")
    return rule


class AlertRuleList(APIView):
    """List or add your alert rules."""

    @extend_schema(responses=AlertRulesOut, operation_id="alert_rules_list")
    def get(self, request):
        found = AlertRule.objects.filter(user=request.user)
        return Response({"results": AlertRuleOut(found, many=True).data})

    @extend_schema(request=AlertRuleIn, responses={201: AlertRuleOut})
    def post(self, request):
        data = AlertRuleIn(data=request.data)
        data.is_valid(raise_exception=True)
        expression = data.validated_data["expression"]
        try:
            conditions = rules.parse(expression)
        except rules.RuleError as exc:
            raise InvalidInput(f"expression {exc}", field="expression") from None
        with transaction.atomic():
            mine = AlertRule.objects.select_for_update().filter(user=request.user)
            if mine.count() >= settings.GPUMARKET_ALERT_MAX_RULES:
                raise InvalidInput(f"expression: at most {settings.GPUMARKET_ALERT_MAX_RULES}"
                                   " alert rules per user", field="expression")
            rule = AlertRule.objects.create(
                user=request.user, name=data.validated_data.get("name", ""),
                expression=expression, conditions=[c.as_json() for c in conditions])
        return Response(AlertRuleOut(rule).data, status=201)


class AlertRuleDetail(APIView):
    """One of your alert rules, with its latest incidents; or delete it."""

    @extend_schema(responses=AlertRuleOut)
    def get(self, request, pk: int):
        return Response(AlertRuleOut(_rule(request.user.pk, pk)).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        _rule(request.user.pk, pk).delete()
        return Response(status=204)
