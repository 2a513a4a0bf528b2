"""One state machine per stateful model (order, auction, lease).

A model that mixes in `StateMachine` declares `TRANSITIONS = {from: {to, …}}`
and an event model; `set_status(to, cause=…)` refuses a move the table does not
allow (IllegalTransition) and writes the event row — from, to, time, cause —
in the same transaction. Pattern after django-oscar's Order.set_status.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models, transaction
from django.utils import timezone


class IllegalTransition(Exception):
    """A move its state machine does not allow; the message names both states."""


class StateMachine(models.Model):
    TRANSITIONS: ClassVar[dict[str, set[str]]] = {}
    EVENT_RELATED_NAME: ClassVar[str] = "events"

    class Meta:
        abstract = True

    def can_move_to(self, to: str) -> bool:
        return to in self.TRANSITIONS.get(self.status, set())

    def set_status(self, to: str, *, cause: str, detail: dict[str, Any] | None = None,
                   at=None, update_fields: tuple[str, ...] = ()) -> None:
        """Move to `to`, recording (from, to, at, cause, detail); save the status and
        `update_fields`. Raises IllegalTransition."""
        if not self.can_move_to(to):
            raise IllegalTransition(
                f"{self._meta.verbose_name} {self.pk} cannot move from {self.status} to {to}"
            )
        at = at or timezone.now()
        previous = self.status
        self.status = to
        with transaction.atomic():
            self.save(update_fields=["status", *update_fields])
            getattr(self, self.EVENT_RELATED_NAME).create(
                from_status=previous, to_status=to, at=at, cause=cause[:200],
                detail=detail or {},
            )


class StateEvent(models.Model):
    from_status = models.CharField(max_length=24, blank=True)
    to_status = models.CharField(max_length=24)
    at = models.DateTimeField(db_index=True)
    cause = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        abstract = True
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_status or '∅'} → {self.to_status}: {self.cause}"
