"""The runner's heartbeat in front of Django (issue 17; docs/RUNNER_PROTOCOL.md,
"Heartbeat"). HeartbeatFastPath (ASGI middleware) takes a POST to
/api/v1/runner/heartbeat/ with a `Bearer` runner token and a body that `lean_heartbeat`
takes, and queues it to the process's heartbeat batcher (heartbeat_batch.py: written with
the beats that arrived with it, one transaction, by the rule of the DRF view
RunnerHeartbeat's `record`). Everything else goes to Django unchanged, its body
replayed: a body the lean check does not take (so every error message stays the DRF
serializer's), an unknown or rotated token (the view's 401), a host not in
ALLOWED_HOSTS, an HTTPS redirect due, a body over DATA_UPLOAD_MAX_MEMORY_SIZE. Why
outside Django: docs/BID_PATH.md (the same hops).
"""

from __future__ import annotations

import io
import logging
import math
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError

from marketplace import logs, telemetry
from marketplace.api import heartbeat_batch
from marketplace.api.bid_batcher import BidFastPath, _is_secure, _replay, read_body
from marketplace.api.parsers import StrictJSONParser
from marketplace.db_unavailable import RETRY_AFTER_SECONDS, is_database_unavailable
from providers.api import READING_BOUNDS, RUNTIMES
from providers.services import MAX_GPUS_PER_NODE

log = logging.getLogger("gpumarket.api")
PATH = "/api/v1/runner/heartbeat/"


class _Refused(Exception):
    """lean_heartbeat does not take this body: the DRF view answers it."""


def _text(value: Any, max_length: int, *, blank: bool = False) -> str:
    # StrictCharField: a JSON string, trimmed, not blank unless allowed, at most
    # max_length after trimming (NUL and lone surrogates never pass the parser)
    if not isinstance(value, str):
        raise _Refused
    value = value.strip()
    if (not value and not blank) or len(value) > max_length:
        raise _Refused
    return value


def _integer(value: Any) -> int | None:
    # StrictIntegerField(allow_null=True)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused
    return value


def _number(value: Any) -> float | None:
    # StrictNumberField(allow_null=True): float(value), finite
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Refused
    try:
        value = float(value)
    except OverflowError:
        raise _Refused from None
    if not math.isfinite(value):
        raise _Refused
    return value


_READING = (("temperature_c", _integer), ("power_w", _number),
            ("utilization_pct", _integer), ("ecc_uncorrectable", _integer))
_SEVERITIES = ("warn", "fatal")


def _list(data: dict, key: str, max_length: int) -> list:
    value = data.get(key, [])
    if not isinstance(value, list) or len(value) > max_length:
        raise _Refused
    return value


_LEAN_KEYS = frozenset({"runtime", "gpus", "findings", "telemetry"})


def lean_heartbeat(data: Any) -> dict[str, Any] | None:
    """What marketplace.api.telemetry.HeartbeatIn(data=data).validated_data holds (as plain
    dicts: runtime, gpus, findings, telemetry), or None where that serializer would refuse
    `data` or this check is not sure it would take it. Never takes a body the serializer
    refuses (tests/marketplace/api/test_heartbeat_path.py compares them)."""
    try:
        if not isinstance(data, dict) or not _LEAN_KEYS.issuperset(data):
            raise _Refused  # another key (`images`, a typo): the serializer decides
        runtime = data.get("runtime", "")
        if runtime != "" and runtime not in RUNTIMES:
            raise _Refused
        gpus = []
        for item in _list(data, "gpus", MAX_GPUS_PER_NODE):
            if not isinstance(item, dict) or "uuid" not in item:
                raise _Refused
            reading = {"uuid": _text(item["uuid"], 64)}
            for key, check in _READING:
                if key in item:
                    value = reading[key] = check(item[key])
                    low, high = READING_BOUNDS[key]
                    if value is not None and not low <= value <= high:
                        raise _Refused
            gpus.append(reading)
        findings = []
        for item in _list(data, "findings", 512):
            if not isinstance(item, dict) or item.get("severity") not in _SEVERITIES:
                raise _Refused
            findings.append({
                "uuid": _text(item.get("uuid"), 64), "rule": _text(item.get("rule"), 40),
                "severity": item["severity"],
                "evidence": _text(item["evidence"], 1000, blank=True)
                if "evidence" in item else ""})
        items = _list(data, "telemetry", telemetry.MAX_LEASES)
        if any(item is None for item in items):
            raise _Refused
    except _Refused:
        return None
    return {"runtime": runtime, "gpus": gpus, "findings": findings, "telemetry": items,
            "images": None}  # a body with `images` goes to the serializer


class HeartbeatFastPath(BidFastPath):
    """ASGI middleware: the runner's valid heartbeats in a heartbeat thread, everything
    else to `app` (module docstring)."""

    def __init__(self, app) -> None:
        super().__init__(app)
        self.path = PATH

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] != scope.get("root_path", "") + self.path):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        # RunnerTokenAuthentication: exactly "Bearer <token>"
        words = headers.get(b"authorization", b"").decode("latin-1").split()
        token = words[1] if len(words) == 2 and words[0] == "Bearer" else None
        body, more, too_big = await read_body(receive)
        if too_big:
            token = None  # Django refuses it
        beat = None
        secure = _is_secure(scope, headers)
        if (token is not None and not more and self._host_ok(headers)
                and headers.get(b"content-type", b"").split(b";")[0].strip()
                == b"application/json"
                and not (settings.SECURE_SSL_REDIRECT and not secure)):
            try:
                beat = lean_heartbeat(StrictJSONParser().parse(
                    io.BytesIO(body), "application/json", {}))
            except ParseError:
                beat = None
        if beat is not None:
            request_id = logs.request_id_from(
                headers.get(logs.REQUEST_ID_HEADER.lower().encode(), b"").decode("latin-1"))
            try:
                status, answer = await heartbeat_batch.batcher().serve(token, beat,
                                                                       request_id)
            except heartbeat_batch.Unknown:
                pass
            except Exception as exc:  # a bug, the database gone
                if is_database_unavailable(exc):
                    log.warning("[request %s] 503 for a heartbeat: no database connection "
                                "(%s)", request_id, type(exc).__name__)
                    return await self._respond(
                        send, 503, {"detail": "the service is busy: no database connection "
                                              "is free right now; the heartbeat was not "
                                              f"recorded, retry in {RETRY_AFTER_SECONDS} s"},
                        request_id, secure,
                        extra=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
                log.exception("[request %s] recording a heartbeat failed", request_id)
                return await self._respond(
                    send, 500, {"detail": "server error: the heartbeat may not be recorded; "
                                          f"it is logged as request {request_id}",
                                "request_id": request_id}, request_id, secure)
            else:
                return await self._respond(send, status, answer, request_id, secure)
        await self.app(scope, _replay(body, more, receive), send)
