"""The pages' login and signup under the API's limits (marketplace/api/throttles.py, the
same counters): too many attempts from one address, or failures for one username, are a
429 page with Retry-After, the form shown again with what to do."""

from __future__ import annotations

import functools

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import forms as auth_forms
from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.shortcuts import render
from rest_framework.exceptions import Throttled

from marketplace.api import throttles


def throttled_page(request, template: str, form, exc: Throttled):
    """`template` with `form` (unbound) and the refusal, as a 429 with Retry-After."""
    wait = int(exc.wait or 1)
    response = render(request, template, {
        "form": form,
        "throttled": f"Too many attempts. Try again in {wait} seconds.",
    }, status=429)
    response["Retry-After"] = str(wait)
    return response


class _CountedLogin:
    """Each attempt counted against its username (a success is taken back: only failures
    lock); over the limit, Throttled."""

    def clean(self):
        username = self.cleaned_data.get("username")
        if username and self.cleaned_data.get("password"):
            attempt = throttles.begin_login(username)  # Throttled: LoginView answers 429
            cleaned = super().clean()
            attempt.succeeded()
            return cleaned
        return super().clean()


class AuthenticationForm(_CountedLogin, auth_forms.AuthenticationForm):
    """Django's form, counted (the pages' login)."""


class AdminLoginForm(_CountedLogin, AdminAuthenticationForm):
    """The admin's form (staff only), counted alike."""


def admin_login(request, extra_context=None):
    """The admin's login under the same limits as the pages' and the API's: per client
    address (GPUMARKET_LOGIN_RATE) and per username; a refusal is a plain 429 with
    Retry-After."""
    try:
        if request.method == "POST":
            throttles.check(request, throttles.LoginAddressThrottle)
        return admin.site.login(request, extra_context)
    except Throttled as exc:
        wait = int(exc.wait or 1)
        response = HttpResponse(f"Too many attempts. Try again in {wait} seconds.\n",
                                status=429, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(wait)
        return response


admin.site.login_form = AdminLoginForm


class LoginView(auth_views.LoginView):
    """Django's LoginView, counted per client address (GPUMARKET_LOGIN_RATE, shared with
    POST /api/v1/auth/token/) and per username; a refused form answers 400."""

    form_class = AuthenticationForm

    def form_invalid(self, form):
        """A refused form (wrong password, NUL in a field) is a 400, as on every page."""
        response = super().form_invalid(form)
        response.status_code = 400
        return response

    def post(self, request, *args, **kwargs):
        try:
            throttles.check(request, throttles.LoginAddressThrottle)
            return super().post(request, *args, **kwargs)
        except Throttled as exc:
            return throttled_page(request, self.template_name, self.form_class(request), exc)


def signup_limited(form_class, template: str):
    """Decorator of the signup page view: a POST counts against the address's signups
    (GPUMARKET_SIGNUP_RATE, shared with POST /api/v1/signup/)."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            if request.method == "POST":
                try:
                    throttles.check(request, throttles.SignupAddressThrottle)
                except Throttled as exc:
                    return throttled_page(request, template, form_class(), exc)
            return view(request, *args, **kwargs)
        return wrapped

    return decorate
