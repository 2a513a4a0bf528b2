"""One state machine per stateful model (order, auction, lease, sealed bid).

A model that mixes in `StateMachine` declares `TRANSITIONS = {from: {to, …}}` and
(unless `EVENT_RELATED_NAME` is None) an event model. Every event row goes through it:
`created()` (from "" to the initial state), `set_status()` (a transition; IllegalTransition
for a move the table does not allow) and `note()` (no transition: the state stays).
Pattern after django-oscar's Order.set_status; the table per model: marketplace/models.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models, transaction
from django.db.models.signals import post_save
from django.utils import timezone

from core.bulk import insert_all, update_all


class IllegalTransition(Exception):
    """A move its state machine does not allow; the message names both states."""


class StateMachine(models.Model):
    TRANSITIONS: ClassVar[dict[str, set[str]]] = {}
    EVENT_RELATED_NAME: ClassVar[str | None] = "events"  # None: no events table

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
        if self.EVENT_RELATED_NAME is None:
            self.save(update_fields=["status", *update_fields])
            return
        with transaction.atomic():
            self.save(update_fields=["status", *update_fields])
            self._events().create(
                from_status=previous, to_status=to, at=at, cause=cause[:200],
                detail=detail or {},
            )

    @classmethod
    def set_status_many(cls, rows: list[StateMachine], to: str, *, causes: list[str],
                        details: list[dict[str, Any] | None] | None = None, at=None,
                        update_fields: tuple[str, ...] = ()) -> None:
        """set_status on each of `rows` (saved instances of this model), cause and detail
        per row, in a fixed number of statements: one UPDATE of status and
        `update_fields` for all, one INSERT of all their events (core.bulk); post_save is
        sent for each row, as its save() would. Raises
        IllegalTransition, changing nothing, when one row may not move to `to`."""
        if not rows:
            return
        for row in rows:
            if not row.can_move_to(to):
                raise IllegalTransition(
                    f"{row._meta.verbose_name} {row.pk} cannot move from {row.status} to {to}")
        at = at or timezone.now()
        details = details or [None] * len(rows)
        previous = [row.status for row in rows]
        for row in rows:
            row.status = to
        fields = ["status", *dict.fromkeys(update_fields)]
        with transaction.atomic(savepoint=False):
            update_all(rows, fields)
            # as save() would: the live feed and the runners' push listen (runner_push)
            using, saved = rows[0]._state.db, frozenset(fields)
            for row in rows:
                post_save.send(sender=cls, instance=row, created=False, raw=False,
                               using=using, update_fields=saved)
            if cls.EVENT_RELATED_NAME is None:
                return
            events = rows[0]._events()
            insert_all([events.model(**{events.field.name: row}, from_status=was,
                                     to_status=to, at=at, cause=cause[:200],
                                     detail=detail or {})
                        for row, was, cause, detail in zip(rows, previous, causes, details,
                                                           strict=True)])

    def moved_event(self, to: str, *, cause: str, at=None,
                    detail: dict[str, Any] | None = None) -> StateEvent:
        """Move this (saved) row to `to` in memory only and return the move's unsaved
        event (from its state before to `to`), for a caller that saves many rows and
        bulk-inserts their events itself (marketplace/fills_many.py). Several moves of
        one row chain (each event from the previous move's state). Raises
        IllegalTransition, the row unchanged, for a move its table does not allow."""
        if not self.can_move_to(to):
            raise IllegalTransition(
                f"{self._meta.verbose_name} {self.pk} cannot move from {self.status} to {to}"
            )
        previous, self.status = self.status, to
        events = self._events()
        return events.model(**{events.field.name: self}, from_status=previous, to_status=to,
                            at=at or timezone.now(), cause=cause[:200], detail=detail or {})

    def created_event(self, *, cause: str, at=None,
                      detail: dict[str, Any] | None = None) -> StateEvent:
        """The unsaved first event of this (saved) row, from "" to its initial state: for
        a bulk insert of many rows' events. Raises IllegalTransition when the row is not
        in the initial state (its status field's default)."""
        initial = str(self._meta.get_field("status").default)
        if self.status != initial:
            raise IllegalTransition(f"{self._meta.verbose_name} {self.pk} is {self.status}, "
                                    f"not its initial state {initial}")
        events = self._events()
        return events.model(**{events.field.name: self}, from_status="", to_status=initial,
                            at=at or timezone.now(), cause=cause[:200], detail=detail or {})

    def created(self, *, cause: str, at=None, detail: dict[str, Any] | None = None) -> None:
        """Record the first event of this new (saved) row: from "" to its initial state."""
        self.created_event(cause=cause, at=at, detail=detail).save(force_insert=True)

    def note(self, *, cause: str, at=None, detail: dict[str, Any] | None = None,
             update_fields: tuple[str, ...] = ()) -> None:
        """Record an event that is not a transition (from = to = the current state), e.g. a
        preemption scheduled or called off; save `update_fields` first, if any."""
        events = self._events()
        with transaction.atomic(savepoint=False):
            if update_fields:
                self.save(update_fields=list(update_fields))
            events.create(from_status=self.status, to_status=self.status,
                                  at=at or timezone.now(), cause=cause[:200],
                                  detail=detail or {})

    def _events(self):
        if self.EVENT_RELATED_NAME is None:
            raise TypeError(f"{self._meta.verbose_name} has no events table")
        return getattr(self, self.EVENT_RELATED_NAME)


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
