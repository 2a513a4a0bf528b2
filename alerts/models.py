"""A user's alert rules, the per-subject state of each (since when each condition has
held) and the incidents (fired, then resolved) it recorded. A subject is one of the
user's running leases (`lease:<id>`) or nodes (`node:<id>`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AlertRule(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="alert_rules")
    name = models.CharField(max_length=100, blank=True)
    expression = models.CharField(max_length=500)
    conditions = models.JSONField(default=list, help_text="the parsed expression")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"alert {self.pk}: {self.expression}"


class AlertState(models.Model):
    """`since`: per condition, the ISO time it started to hold (None: it does not)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="states")
    subject = models.CharField(max_length=40)
    since = models.JSONField(default=list)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "subject"],
                                               name="one_alert_state_per_subject")]

    def __str__(self) -> str:
        return f"alert {self.rule_id} on {self.subject}"


class AlertIncident(models.Model):
    """One firing of a rule on a subject: open while `resolved_at` is None."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="incidents")
    subject = models.CharField(max_length=40)
    values = models.JSONField(default=dict, help_text="the metrics when it fired")
    fired_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fired_at", "-pk"]
        constraints = [models.UniqueConstraint(
            fields=["rule", "subject"], condition=models.Q(resolved_at__isnull=True),
            name="one_open_incident_per_subject")]

    def __str__(self) -> str:
        return f"alert {self.rule_id} on {self.subject} fired {self.fired_at.isoformat()}"
