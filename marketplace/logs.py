"""Request ids and clean logs.

- RequestIdMiddleware (first in MIDDLEWARE): each request gets an id — the client's
  `X-Request-ID` when it looks sane (1–64 characters of `A-Za-z0-9._:-`), else 32 random
  hex digits — as `request.request_id`, on the answer's `X-Request-ID` header, and on
  every log line written while it is served (RequestIdFilter: `%(request_id)s`, "-"
  outside a request). A 500 names it too (marketplace/api/errors.py), so a user's report
  finds its traceback.
- RedactCredentials: uvicorn logs each request's path with its query string (access
  log; "WebSocket /ws/me/?…" lines): the value of any credential-like parameter
  (token, ticket, key, password, secret, …) is replaced by `[redacted]`.
  `install_uvicorn_redaction()` (marketplace/apps.py) puts it on uvicorn's loggers.
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

REQUEST_ID_HEADER = "X-Request-ID"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_current: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def request_id_from(header: str | None) -> str:
    """The client's id when it is sane, else a new one (32 hex digits)."""
    if header and _SANE.fullmatch(header):
        return header
    return uuid.uuid4().hex


def current_request_id() -> str:
    """The id of the request being served in this context, "-" outside one."""
    return _current.get()


class RequestIdMiddleware:
    """Sets request.request_id, the context's id for log lines and the response header."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        reset = _current.set(request.request_id)
        try:
            response = self.get_response(request)
        finally:
            _current.reset(reset)
        response[REQUEST_ID_HEADER] = request.request_id
        return response


class RequestIdFilter(logging.Filter):
    """Gives every record `request_id`: its request's (Django passes `request` with
    its request errors), else the context's, else "-"."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        record.request_id = getattr(request, "request_id", None) or _current.get()
        return True


_CREDENTIAL_PARAM = re.compile(
    r"(?i)([?&;](?:[a-z0-9_-]*(?:token|ticket|key|password|passwd|secret|auth[a-z_]*|"
    r"session[a-z_]*|signature|sig))=)[^&;#\s\"']*")


def redact(text: str) -> str:
    """`text` with the values of credential-like URL parameters replaced."""
    return _CREDENTIAL_PARAM.sub(r"\1[redacted]", text)


class RedactCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def install_uvicorn_redaction() -> None:
    """Put RedactCredentials on uvicorn's loggers (idempotent). Harmless without uvicorn."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())
