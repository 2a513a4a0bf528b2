"""The worker's evaluation of every enabled alert rule on its user's running leases (as
buyer) and nodes (as provider; not for a rule on lease_cost). Metrics come from the
GPUs' latest heartbeat readings (providers' Gpu.last_health) and the lease's clock:
gpu_utilization the mean, gpu_temperature and gpu_ecc_errors the highest, gpu_power the
sum; lease_cost in micro-USD. A rule fires on a subject when every condition has held
for its duration; it resolves when one no longer holds. Each is recorded (AlertIncident)
and told by webhook (`alert.fired`, `alert.resolved`) and email (Django's mail backend)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from alerts.models import AlertIncident, AlertRule, AlertState
from alerts.rules import Condition, for_leases_only
from marketplace.models import Lease
from providers.models import Gpu, Node
from settlement.money import format_usd, lease_cost
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.alerts")


def conditions_of(rule: AlertRule) -> list[Condition]:
    from decimal import Decimal

    return [Condition(c["metric"], c["op"], Decimal(c["threshold"]), c["for_seconds"])
            for c in rule.conditions]


def gpu_metrics(readings: list[dict]) -> dict:
    def values(key):
        return [r[key] for r in readings if isinstance(r.get(key), int | float)]

    util, temp, power, ecc = (values(k) for k in ("utilization_pct", "temperature_c",
                                                   "power_w", "ecc_uncorrectable"))
    return {"gpu_utilization": sum(util) / len(util) if util else None,
            "gpu_temperature": max(temp) if temp else None,
            "gpu_power": sum(power) if power else None,
            "gpu_ecc_errors": max(ecc) if ecc else None}


def lease_metrics(lease: Lease, now: datetime) -> dict:
    readings = [lg.gpu.last_health or {} for lg in lease.lease_gpus.select_related("gpu")]
    seconds = 0
    if lease.started_at:
        seconds = max(0, min(int((now - lease.started_at).total_seconds()),
                             lease.duration_seconds))
    return {**gpu_metrics(readings),
            "lease_cost": lease_cost(lease.price, lease.gpu_count, seconds)}


def subjects(rule: AlertRule, now: datetime) -> dict[str, dict]:
    """subject → its metrics, for the rule's user."""
    found = {}
    for lease in Lease.objects.filter(buyer_id=rule.user_id, status=Lease.Status.RUNNING):
        found[f"lease:{lease.pk}"] = lease_metrics(lease, now)
    if not for_leases_only(conditions_of(rule)):
        for node in Node.objects.filter(provider__user_id=rule.user_id):
            readings = [g.last_health or {} for g in Gpu.objects.filter(node=node)]
            found[f"node:{node.pk}"] = gpu_metrics(readings)
    return found


def evaluate_rule(rule: AlertRule, now: datetime | None = None) -> list[str]:
    """Update the rule's state on each subject; returns what fired or resolved
    (["fired lease:3", …])."""
    now = now or timezone.now()
    conditions = conditions_of(rule)
    changed = []
    current = subjects(rule, now)
    with transaction.atomic():
        states = {s.subject: s for s in AlertState.objects.select_for_update()
                  .filter(rule=rule)}
        open_ = {i.subject: i for i in AlertIncident.objects.filter(rule=rule,
                                                                     resolved_at=None)}
        for subject, metrics in current.items():
            state = states.get(subject) or AlertState(rule=rule, subject=subject)
            since = (state.since or [None] * len(conditions))[:len(conditions)]
            since += [None] * (len(conditions) - len(since))
            met = True
            for i, c in enumerate(conditions):
                if c.holds(metrics[c.metric]):
                    since[i] = since[i] or now.isoformat()
                    held = (now - parse_datetime(since[i])).total_seconds()
                    met = met and held >= c.for_seconds
                else:
                    since[i], met = None, False
            state.since, state.updated_at = since, now
            state.save()
            if met and subject not in open_:
                _fire(rule, subject, metrics, now)
                changed.append(f"fired {subject}")
            elif not met and subject in open_:
                _resolve(open_[subject], now)
                changed.append(f"resolved {subject}")
        for subject, incident in open_.items():  # a lease that ended, a node removed
            if subject not in current:
                _resolve(incident, now)
                changed.append(f"resolved {subject}")
        AlertState.objects.filter(rule=rule).exclude(subject__in=current).delete()
    return changed


def _shown(metrics: dict) -> dict:
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in metrics.items()}


def _payload(rule: AlertRule, incident: AlertIncident) -> dict:
    kind, _, pk = incident.subject.partition(":")
    return {"rule": rule.pk, "name": rule.name, "expression": rule.expression,
            "subject": incident.subject, kind: int(pk), "values": incident.values,
            "fired_at": incident.fired_at.isoformat(),
            "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None}


def _fire(rule: AlertRule, subject: str, metrics: dict, now: datetime) -> None:
    incident = AlertIncident.objects.create(rule=rule, subject=subject,
                                            values=_shown(metrics), fired_at=now)
    webhooks.emit(rule.user_id, "alert.fired", _payload(rule, incident))
    _mail(rule, incident, "firing")


def _resolve(incident: AlertIncident, now: datetime) -> None:
    incident.resolved_at = now
    incident.save(update_fields=["resolved_at"])
    webhooks.emit(incident.rule.user_id, "alert.resolved", _payload(incident.rule, incident))
    _mail(incident.rule, incident, "resolved")


def _mail(rule: AlertRule, incident: AlertIncident, what: str) -> None:
    email = rule.user.email
    if not email:
        return
    values = dict(incident.values)
    if values.get("lease_cost") is not None:
        values["lease_cost"] = f"{format_usd(values['lease_cost'])} USD"
    body = (f"Alert {rule.name or rule.pk} is {what} on {incident.subject}.\n\n"
            f"Rule: {rule.expression}\nValues: {values}\n")
    subject_line = f"[gpumarket] {what}: {rule.name or rule.expression}"[:150]
    transaction.on_commit(lambda: _send(subject_line, body, email))


def _send(subject: str, body: str, email: str) -> None:
    try:
        send_mail(subject, body, None, [email])
    except OSError as exc:  # an SMTP server away: the webhook and the record remain
        log.warning("alert mail to user not sent: %s", type(exc).__name__)


def evaluate_all(now: datetime | None = None) -> list[str]:
    changed = []
    for rule in AlertRule.objects.filter(enabled=True).select_related("user"):
        changed += [f"rule {rule.pk} {c}" for c in evaluate_rule(rule, now)]
    return changed
