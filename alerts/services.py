"""Create and delete a user's alert rules; refusals are marketplace.errors naming the
field (`expression`, with the parser's position), nothing written on a refusal."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from alerts import rules
from alerts.models import AlertRule
from marketplace.errors import InvalidInput, NotFound


def create_rule(*, user_id: int, expression: str, name: str = "") -> AlertRule:
    try:
        conditions = rules.parse(expression)
    except rules.RuleError as exc:
        raise InvalidInput(f"expression {exc}", field="expression") from None
    with transaction.atomic():
        mine = AlertRule.objects.select_for_update().filter(user_id=user_id)
        if mine.count() >= settings.GPUMARKET_ALERT_MAX_RULES:
            raise InvalidInput(f"expression: at most {settings.GPUMARKET_ALERT_MAX_RULES} "
                               "alert rules per user", field="expression")
        return AlertRule.objects.create(user_id=user_id, name=name, expression=expression,
                                        conditions=[c.as_json() for c in conditions])


def rule_of(*, user_id: int, rule_id: int) -> AlertRule:
    rule = AlertRule.objects.filter(user_id=user_id, pk=rule_id).first()
    if rule is None:
        raise NotFound(f"no alert rule {rule_id}")
    return rule


def delete_rule(*, user_id: int, rule_id: int) -> None:
    rule_of(user_id=user_id, rule_id=rule_id).delete()
