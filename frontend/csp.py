"""The pages' Content-Security-Policy: scripts, styles, images and connections from this
site only, plus Stripe.js from STRIPE_JS_URL's origin when Stripe is configured; an inline
script runs only with this response's nonce (`<script nonce="{{ request.csp_nonce }}">`);
no plugins, no framing, no <base>. Set on every HTML response (pages and admin) but the
third-party Swagger UI at /api/docs/ (inline script and style; it shows the public schema
only); JSON answers carry none (nothing in them runs).

A small middleware instead of django-csp because the policy follows the settings of each
request (STRIPE_JS_URL, STRIPE_API_BASE: tests point them at a local Stripe mock)."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.deprecation import MiddlewareMixin

from frontend.stripe_views import stripe_js_url

EXEMPT_PREFIXES = ("/api/docs/",)
_STRIPE_JS = "https://js.stripe.com"


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def policy(request, nonce: str) -> str:
    """The header's value for `request` (ws/wss of its own host for the live feed)."""
    host = request.get_host()
    script = ["'self'", f"'nonce-{nonce}'"]
    connect = ["'self'", f"ws://{host}", f"wss://{host}"]
    frame, img = ["'self'"], ["'self'", "data:"]
    url = stripe_js_url()
    js = _origin(url) if url else None
    if js:
        script.append(js)
        frame.append(js)
        connect.extend(o for o in (js, _origin(settings.STRIPE_API_BASE)) if o)
        if js == _STRIPE_JS:  # what Stripe.js itself loads (Stripe's CSP guide)
            frame.append("https://hooks.stripe.com")
            connect.append("https://api.stripe.com")
            img.append("https://*.stripe.com")
    directives = {
        "default-src": ["'self'"], "script-src": script, "style-src": ["'self'"],
        "img-src": img, "connect-src": sorted(set(connect), key=connect.index),
        "frame-src": frame, "object-src": ["'none'"], "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
    }
    return "; ".join(f"{name} {' '.join(values)}" for name, values in directives.items())


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Gives each request `csp_nonce` and each HTML response its Content-Security-Policy."""

    def process_request(self, request):
        request.csp_nonce = secrets.token_urlsafe(18)

    def process_response(self, request, response):
        if ("Content-Security-Policy" in response
                or not response.get("Content-Type", "").startswith("text/html")
                or request.path.startswith(EXEMPT_PREFIXES)):
            return response
        nonce = getattr(request, "csp_nonce", None) or secrets.token_urlsafe(18)
        response["Content-Security-Policy"] = policy(request, nonce)
        return response
