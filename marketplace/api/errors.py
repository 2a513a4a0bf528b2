"""One error shape for the whole API.

`{"detail": "<field>: <message>", "errors": {"<field>": ["<message>", …]}}` with
400 for bad input, 401/403/404 as usual, 409 for a state conflict. Domain errors
(MarketError, ProviderError, SettlementError) become responses here, so views stay
thin; nothing else is caught, so a bug is still a 500 with a log entry (never a
traceback to the client: DEBUG pages are off for the API).
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from marketplace.errors import MarketError
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
    first_field, messages = next(iter(errors.items()))
    detail = f"{first_field}: {messages[0]}" if first_field else messages[0]
    return {"detail": detail, "errors": errors}


def error_response(message: str, *, field: str | None, status_code: int) -> Response:
    """`{"detail": "<field>: <message>", "errors": {"<field>": [message]}}`, or just
    `{"detail": message}` when no single field is at fault."""
    if not field:
        return Response({"detail": message}, status=status_code)
    return Response(_body({field: [message]}), status=status_code)


def exception_handler(exc, context):
    if isinstance(exc, MarketError):
        return error_response(exc.message, field=exc.field, status_code=exc.status)
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
        response.data = _body(errors or {"": ["bad request"]})
    return response


def api_not_found(request, *args, **kwargs):
    """JSON 404 for any unknown URL under /api/ (also when the trailing slash is missing,
    which Django would otherwise answer with an HTML error for a POST)."""
    from django.http import JsonResponse
    from django.urls import Resolver404, resolve

    detail = f"no API endpoint at {request.path}"
    if not request.path.endswith("/"):
        try:
            resolve(request.path + "/")
            detail += f": did you mean {request.path}/ ?"
        except Resolver404:
            pass
    return JsonResponse({"detail": detail}, status=404)
