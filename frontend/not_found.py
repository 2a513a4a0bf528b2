"""Not found, the same answer with DEBUG on or off (marketplace/api/errors.not_found: JSON
under /api/, the friendly page frontend/templates/404.html elsewhere), never Django's debug
page: Django only uses handler404 with DEBUG off, so this middleware answers first, for a
path no URL pattern matches and for Http404 raised by a view."""

from __future__ import annotations

from django.http import Http404
from django.urls import Resolver404, get_resolver

from marketplace.api.errors import not_found


class NotFoundMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        try:
            get_resolver(getattr(request, "urlconf", None)).resolve(request.path_info)
        except Resolver404:
            return not_found(request)  # (CommonMiddleware may still add the slash)
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, Http404):
            return not_found(request)
        return None
