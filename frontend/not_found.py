"""A 404 is the site's own answer with DEBUG on too (the demo): a friendly HTML page, or
JSON under /api/ (marketplace/api/errors.page_not_found), never Django's technical
"yellow" 404 page, which lists every URL pattern. With DEBUG off Django already calls
that handler; this middleware does the same under DEBUG, for a view's Http404 and for a
path that matches no URL."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404

from marketplace.api import errors


class FriendlyNotFoundMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (settings.DEBUG and response.status_code == 404
                and getattr(request, "resolver_match", None) is None
                and response.get("Content-Type", "").startswith("text/html")):
            return errors.page_not_found(request, None)  # no URL matched
        return response

    def process_exception(self, request, exception):
        if settings.DEBUG and isinstance(exception, Http404):
            return errors.page_not_found(request, exception)
        return None
