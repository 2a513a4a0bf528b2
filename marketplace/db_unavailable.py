"""503, never 500, when the database cannot be had: this process's connection pool has
none free within GPUMARKET_DB_POOL_TIMEOUT (psycopg_pool.PoolTimeout), or PostgreSQL
refuses a connection ("sorry, too many clients already", starting up, unreachable).

The answer is `503 Service Unavailable` with `Retry-After: <seconds>`: under /api/ the
API's error shape (`{"detail": "…"}`, marketplace/api/errors.py), elsewhere a plain
page. DatabaseUnavailableMiddleware answers for views (DRF's too: its handler re-raises
what it does not know); `unavailable_response` also serves Django's 500 handler, for a
failure outside any view, and the bid batcher (marketplace/api/bid_batcher.py).
"""

from __future__ import annotations

import logging
import re

from django.http import HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

log = logging.getLogger("gpumarket.db")

RETRY_AFTER_SECONDS = 5

# libpq's own words when a connection is refused or cannot be made (SQLSTATE is not
# always there for an error raised while connecting)
_REFUSED = re.compile(
    r"too many clients|remaining connection slots are reserved|too many connections"
    r"|the database system is (starting up|shutting down|in recovery mode)"
    r"|connection failed|could not connect|connection refused|connection timeout expired",
    re.IGNORECASE)
_SQLSTATES = {"53300",  # too_many_connections
              "57P03",  # cannot_connect_now
              "08001", "08004", "08006"}  # cannot connect, rejected, connection failure


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_database_unavailable(exc: BaseException | None) -> bool:
    """True when `exc` (or what caused it) says no database connection could be had."""
    import psycopg
    from django.db import OperationalError
    from psycopg_pool import PoolTimeout, TooManyRequests

    for e in _chain(exc):
        if isinstance(e, PoolTimeout | TooManyRequests):
            return True
        if isinstance(e, OperationalError | psycopg.OperationalError) and (
                getattr(e, "sqlstate", None) in _SQLSTATES or _REFUSED.search(str(e))):
            return True
    return False


def unavailable_response(request) -> HttpResponse:
    """The 503 for `request`: JSON under /api/, a plain page elsewhere."""
    from marketplace.api.errors import is_api

    message = (f"the service is busy: no database connection is free right now; "
               f"retry in {RETRY_AFTER_SECONDS} s")
    if is_api(request):
        response = JsonResponse({"detail": message}, status=503)
    else:
        response = HttpResponse(
            "<!doctype html><title>Busy</title><h1>Busy, try again shortly</h1>"
            f"<p>{message}.</p>", status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """A view's exception that means "no database connection" becomes the 503 (sync and
    async alike: MiddlewareMixin, so it adds no thread hop under ASGI)."""

    def process_exception(self, request, exception):
        if not is_database_unavailable(exception):
            return None
        log.warning("503 for %s %s: no database connection (%s)", request.method,
                    request.path, type(exception).__name__)
        return unavailable_response(request)
