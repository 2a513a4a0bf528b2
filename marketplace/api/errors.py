"""One error shape for the whole API.

Every error is a JSON object with `detail`, one line for people. `errors` is there
exactly when fields of the request are at fault, and names each of them:
`{"detail": "<field>: <message>", "errors": {"<field>": ["<message>", …]}}` (a body
field, `a.b` / `a[0].b` inside it, or a query parameter such as `limit`). Without a
field to name — a body that is not JSON, 401/403 credentials, a 409 state conflict, a
413, 415, 429 or 5xx — it is `{"detail": "<message>"}` alone: never an empty field name.
400 for bad input, 401/403/404 as usual, 409 for a state conflict, 429 (with
Retry-After) for too many logins or signups, 503 (with Retry-After) when no database
connection is free (marketplace/db_unavailable.py). Domain errors
(MarketError, ProviderError, SettlementError) become responses here, so views stay
thin; nothing else is caught, so a bug is still a 500 whose traceback is logged with
the request id, and whose body is `{"detail": …, "request_id": "<id>"}` (never a
traceback to the client: DEBUG pages are off for the API). Django's own 400/403/404/500
answers under /api/ are JSON too (the handlers below, set in marketplace/urls.py).
"""

from __future__ import annotations

import sys

from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError
from django.http import HttpResponseNotFound, HttpResponseServerError, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from marketplace.api.parsers import FieldParseError
from marketplace.errors import MarketBusy, MarketError, busy_message, is_lock_timeout
from marketplace.logs import current_request_id
from providers.services import ProviderError
from settlement.money import MoneyFormatError
from settlement.services import InsufficientFunds, SettlementError


def _flatten(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, int):  # DRF keys errors of list items by their index
                path = f"{prefix}[{key}]"
            else:
                name = "" if key == "non_field_errors" else key
                path = f"{prefix}.{name}" if prefix and name != "" else (prefix or name)
            yield from _flatten(value, path)
    elif isinstance(data, list):
        if all(not isinstance(v, dict | list) for v in data):
            for v in data:
                yield prefix, str(v)
        else:
            for i, v in enumerate(data):
                if v:
                    yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, str(data)


def _body(errors: dict[str, list[str]]) -> dict:
    """The error body of `errors` ({field: messages}); the field "" holds the messages
    that name no field (DRF's non_field_errors at the top level): they become `detail`,
    and `errors` keeps the named fields only (absent when there are none)."""
    unnamed = errors.get("", [])
    named = {field: messages for field, messages in errors.items() if field}
    if unnamed:
        body = {"detail": " ".join(unnamed)}
    elif named:
        first_field, messages = next(iter(named.items()))
        body = {"detail": f"{first_field}: {messages[0]}"}
    else:
        body = {"detail": "bad request"}
    if named:
        body["errors"] = named
    return body


def error_response(message: str, *, field: str | None, status_code: int) -> Response:
    """`{"detail": "<field>: <message>", "errors": {"<field>": [message]}}`, or just
    `{"detail": message}` when no single field is at fault."""
    if not field:
        return Response({"detail": message}, status=status_code)
    return Response(_body({field: [message]}), status=status_code)


def exception_handler(exc, context):
    if isinstance(exc, FieldParseError):  # a duplicate key, a NUL in a string
        return error_response(exc.message, field=exc.key, status_code=exc.status_code)
    if isinstance(exc, MarketError):
        response = error_response(exc.message, field=exc.field, status_code=exc.status)
        if isinstance(exc, MarketBusy):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, OperationalError) and is_lock_timeout(exc):  # a later lock, same wait
        return exception_handler(MarketBusy(busy_message()), context)
    if isinstance(exc, ProviderError):
        return error_response(exc.message, field=exc.field, status_code=exc.status)
    if isinstance(exc, InsufficientFunds):
        return error_response(str(exc), field="price", status_code=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, SettlementError):
        return error_response(str(exc), field=None, status_code=status.HTTP_409_CONFLICT)
    if isinstance(exc, MoneyFormatError):
        return error_response(str(exc), field=None, status_code=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, RequestDataTooBig):
        return error_response("the request body is too large", field=None,
                              status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    response = drf_handler(exc, context)
    if response is not None and isinstance(exc, ValidationError):
        errors: dict[str, list[str]] = {}
        for field, message in _flatten(response.data):
            errors.setdefault(field, []).append(message)
        response.data = _body(errors)
    return response


def is_api(request) -> bool:
    return request.path == "/api" or request.path.startswith("/api/")


@csrf_exempt  # it writes nothing: every method, with or without a session, gets the 404
def api_not_found(request, *args, **kwargs):
    """JSON 404 for any unknown URL under /api/ and any method (also when the trailing
    slash is missing, which Django would otherwise answer with an HTML error for a
    POST: its CSRF page, or a redirect that drops the body)."""
    from django.urls import Resolver404, resolve

    detail = f"no API endpoint at {request.path}"
    if not request.path.endswith("/"):
        try:
            resolve(request.path + "/")
            detail += f": did you mean {request.path}/ ?"
        except Resolver404:
            pass
    return JsonResponse({"detail": detail}, status=404)


# Django's own error answers (marketplace/urls.py handler400/403/404/500): JSON for /api/
# paths, Django's default page elsewhere. They are used when DEBUG is off (with DEBUG on,
# Django shows its debug pages instead).
def bad_request(request, exception):
    if is_api(request):
        return JsonResponse({"detail": "bad request"}, status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception):
    if is_api(request):
        return JsonResponse({"detail": "you may not do this"}, status=403)
    return defaults.permission_denied(request, exception)


def not_found(request):
    """The 404: `{"detail": "nothing at <path>"}` under /api/, else the friendly page
    404.html (frontend/templates/); with DEBUG on too (frontend/not_found.py)."""
    if is_api(request):
        return JsonResponse({"detail": f"nothing at {request.path}"}, status=404)
    return HttpResponseNotFound(render_to_string("404.html", {"request_path": request.path},
                                                 request=request))


def page_not_found(request, exception):
    return not_found(request)


def server_error(request):
    """The 500: the traceback is logged (django.request, with the request id: settings
    LOGGING); the answer names the id, never the error. Django calls this inside its
    `except` block: a failure outside any view (a middleware's) that means "no database
    connection" is a 503 instead (db_unavailable.py)."""
    from marketplace.db_unavailable import is_database_unavailable, unavailable_response

    if is_database_unavailable(sys.exc_info()[1]):
        return unavailable_response(request)
    request_id = getattr(request, "request_id", None) or current_request_id()
    if is_api(request):
        return JsonResponse({"detail": f"server error: the request failed; it is logged "
                                       f"as request {request_id}",
                             "request_id": request_id}, status=500)
    try:
        html = render_to_string("frontend/500.html", {"request_id": request_id})
    except Exception:  # the template itself failing must not hide the 500
        return defaults.server_error(request)
    return HttpResponseServerError(html)
