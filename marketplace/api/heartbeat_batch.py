"""Group commit of the runners' heartbeats (issue 17): the ASGI fast path
(heartbeat_path.py) queues each checked beat; one thread per process takes what is queued
(at most GPUMARKET_HEARTBEAT_BATCH_MAX) and writes it as one group: one SELECT of the
tokens' nodes, one of their units (and running leases), then in one transaction one
statement for every node's and changed GPU's row and one for every telemetry sample.
What each beat writes is providers/heartbeat.py's heartbeat_plan, the rule of the single
path (`record`, the DRF view's) too.

Each request still gets its own answer: a refusal (more readings than GPUs) is that
beat's 400, an unknown token that beat's 401 (the DRF view's). A beat that flips a GPU's
health (the locked path), or a second beat of a node already in the group, is recorded
alone after the group. A group that fails (the database, a bug) is rolled back and each
of its beats is recorded alone, so each hears its own outcome: never a beat dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import metrics
from core.group_thread import GroupThread
from marketplace import logs, telemetry
from marketplace.api.errors import exception_handler
from providers import heartbeat, node_images
from providers import services as provider_services

log = logging.getLogger("gpumarket.api")


class Unknown(Exception):
    """No node in service has this token: the DRF view answers (401, its message)."""


def record(node, beat: dict[str, Any]) -> dict[str, Any]:
    """What RunnerHeartbeat.post answers for this node's checked heartbeat (its body),
    one beat alone. An `images` report (docs/IMAGES.md) is checked first: a bad one is a
    ProviderError and nothing of the heartbeat is applied."""
    items = beat.pop("telemetry")
    images = beat.pop("images", None)
    report = node_images.clean_report(images) if images is not None else None
    leases: dict[int, set[str]] | None = {} if items else None
    warnings = provider_services.heartbeat_record(node=node, leases=leases, **beat)
    if report is not None:
        node_images.record(node=node, report=report)
    _kept, errors = telemetry.record(node=node, items=items, gpus_of=leases)
    return _body(warnings, errors)


def _body(warnings: list[str], errors: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"server_time": timezone.now().isoformat()}
    if warnings:
        body["warnings"] = warnings
    if errors:
        body["telemetry_errors"] = errors
    return body


def _refused(exc: provider_services.ProviderError) -> tuple[int, dict]:
    response = exception_handler(exc, {})  # a refusal: as the view answers
    return response.status_code, response.data


def serve_alone(token: str, beat: dict[str, Any], request_id: str) -> tuple[int, dict]:
    """Authenticate, record one beat alone, answer (status, body); raises Unknown. A
    failure closes the connection (a fresh one next)."""
    reset = logs._current.set(request_id)
    try:
        node = provider_services.node_for_token(token, with_user=False)
        if node is None:
            raise Unknown
        try:
            return 200, record(node, dict(beat))
        except provider_services.ProviderError as exc:
            return _refused(exc)
    except Unknown:
        raise
    except Exception:
        connection.close()
        raise
    finally:
        logs._current.reset(reset)


@dataclass
class _Pending:
    token: str
    beat: dict[str, Any]
    request_id: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class HeartbeatBatcher(GroupThread):
    """One thread writing queued heartbeats in groups of at most `max_batch` (module
    docstring); it keeps its database connection until stop()."""

    thread_name, item_name = "heartbeat-batcher", "heartbeat"

    def __init__(self, max_batch: int) -> None:
        super().__init__(max_batch)
        self.served = 0  # heartbeats answered here (not handed to Django)
        self.stats = {"groups": 0, "grouped": 0, "alone": 0, "largest": 0, "failed": 0}

    async def serve(self, token: str, beat: dict[str, Any], request_id: str
                    ) -> tuple[int, dict]:
        """Queue a checked beat (lean_heartbeat's dict) and await (status, body); raises
        Unknown for a token of no node in service, or what recording it raised."""
        self._ensure_thread()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Pending(token, beat, request_id, loop, future))
        return await future

    def _serve(self, group: list[_Pending]) -> list[Any]:
        outcomes = self._outcomes(group)
        self.served += sum(not isinstance(o, BaseException) for o in outcomes)
        return outcomes

    def _outcomes(self, group: list[_Pending]) -> list[Any]:
        """(status, body) or the exception, per beat of `group`, in order."""
        self.stats["groups"] += 1
        self.stats["largest"] = max(self.stats["largest"], len(group))
        try:
            outcomes, alone = self._write(group)
        except Exception:  # rolled back: each beat alone, each hears its own outcome
            log.exception("writing a group of %d heartbeats failed; each is recorded "
                          "alone", len(group))
            self.stats["failed"] += 1
            if connection.connection is not None and not connection.is_usable():
                connection.close()  # a fresh one for what follows
            outcomes, alone = [None] * len(group), list(range(len(group)))
        self.stats["grouped"] += len(group) - len(alone)
        metrics.HEARTBEAT_GROUP_SIZE.observe(len(group))
        self.stats["alone"] += len(alone)
        for i in alone:
            p = group[i]
            try:
                outcomes[i] = serve_alone(p.token, p.beat, p.request_id)
            except Exception as exc:  # the request hears it (Unknown: the view's 401)
                outcomes[i] = exc
        return outcomes

    def _write(self, group: list[_Pending]) -> tuple[list[Any], list[int]]:
        """The group's outcomes (None where recorded alone) and the indexes to record
        alone (a flip, a node's second beat)."""
        now = timezone.now()
        nodes = provider_services.nodes_for_tokens({p.token for p in group})
        outcomes: list[Any] = [None] * len(group)
        alone: list[int] = []
        mine: dict[int, int] = {}  # node id → index of its beat in the group
        for i, p in enumerate(group):
            node = nodes.get(p.token)
            if node is None:
                outcomes[i] = Unknown()
            elif node.pk in mine:
                alone.append(i)
            else:
                mine[node.pk] = i
        units = heartbeat.unit_rows(list(mine), with_leases=any(
            group[i].beat["telemetry"] for i in mine.values()))
        beats = []  # (index, node, plan, telemetry errors)
        samples: list[tuple[int, dict]] = []
        for node_id, i in mine.items():
            p, node = group[i], nodes[group[i].token]
            rows, leases = units[node_id]
            plan = heartbeat.heartbeat_plan(node=node, units=rows, runtime=p.beat["runtime"],
                                            gpus=p.beat["gpus"], findings=p.beat["findings"],
                                            now=now)
            if plan.refusal:
                outcomes[i] = _refused(provider_services.ProviderError(plan.refusal,
                                                                       field="gpus"))
            elif plan.flips:
                alone.append(i)
            else:
                kept, errors = telemetry.checked(p.beat["telemetry"], leases)
                samples += kept
                beats.append((i, node, plan, errors))
        if beats:
            with transaction.atomic():
                for i, node, plan, _errors in beats:
                    reset = logs._current.set(group[i].request_id)
                    try:
                        provider_services.heartbeat_apply(node, plan, now, write=False)
                    finally:
                        logs._current.reset(reset)
                    provider_services.heartbeat_signals(node, plan, [], [])
                heartbeat.write_beats([(node, plan.changed) for _i, node, plan, _e in beats])
                telemetry.write(samples, now)
        for i, _node, plan, errors in beats:
            outcomes[i] = (200, _body(plan.warnings, errors))
        return outcomes, sorted(alone)


_batcher: HeartbeatBatcher | None = None
_batcher_lock = threading.Lock()


def batcher() -> HeartbeatBatcher:
    """This process's heartbeat batcher (GPUMARKET_HEARTBEAT_BATCH_MAX), made on first
    use; its thread holds one database connection of the process's pool."""
    global _batcher
    with _batcher_lock:
        if _batcher is None:
            _batcher = HeartbeatBatcher(settings.GPUMARKET_HEARTBEAT_BATCH_MAX)
        return _batcher
