"""Issue 10, item 9: with DEBUG=0 the defaults are the safe ones — `manage.py check --deploy`
prints no warning — and the pages carry a Content-Security-Policy that their own scripts
pass (tests/e2e/test_browser_flows.py runs them in Chromium under it)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from tests.conftest import ROOT
from tests.factories import UserFactory
from tests.frontend.test_pages_buyer import login


def _django(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPUMARKET_", "STRIPE_", "SECRET_KEY", "DEBUG"))}
    environ.update({"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
                    "GPUMARKET_SECRETS_KEY": Fernet.generate_key().decode(),
                    "GPUMARKET_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE":
                    "marketplace.settings", **env})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_with_debug_off_prints_no_warning(tmp_path):
    done = _django(tmp_path, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout
    assert "WARNING" not in done.stdout + done.stderr


def test_debug_off_defaults_and_the_explicit_switch_for_a_tls_proxy(tmp_path):
    show = ("from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, "
            "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, "
            "s.SECURE_PROXY_SSL_HEADER)")
    code = f"import django; django.setup(); {show}"
    done = _django(tmp_path, "-c", code)
    assert done.stdout.split() == ["True", "True", "True", "31536000", "None"], done.stderr
    done = _django(tmp_path, "-c", code, GPUMARKET_SSL_REDIRECT="0",
                   GPUMARKET_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert done.stdout.split() == ["False", "True", "True", "31536000",
                                   "('HTTP_X_FORWARDED_PROTO',", "'https')"], done.stderr
    done = _django(tmp_path, "-c", code, DEBUG="1")  # make demo, the test suite
    assert done.stdout.split()[:4] == ["False", "False", "False", "0"], done.stderr


@pytest.mark.django_db
def test_pages_carry_the_policy_and_inline_scripts_its_nonce(client):
    r = client.get(reverse("home"))
    policy = r["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in policy and "object-src 'none'" in policy
    assert "style-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    login(client, UserFactory())
    r = client.get(reverse("orders-page"))
    nonce = re.search(r"'nonce-([^']+)'", r["Content-Security-Policy"]).group(1)
    html = r.content.decode()
    scripts = re.findall(r"<script([^>]*)>", html)
    assert scripts and all("src=" in s or f'nonce="{nonce}"' in s
                           or 'type="application/json"' in s for s in scripts), scripts
    assert ' style="' not in html
    # a second response has another nonce; JSON answers carry no policy
    assert nonce not in client.get(reverse("orders-page"))["Content-Security-Policy"]
    assert "Content-Security-Policy" not in client.get("/api/v1/gpu-classes/")


@pytest.mark.django_db
def test_stripe_js_is_allowed_from_its_configured_origin_only(client, settings):
    settings.STRIPE_SECRET_KEY, settings.STRIPE_PUBLISHABLE_KEY = "sk_test_x", "pk_test_x"
    settings.STRIPE_JS_URL = "http://127.0.0.1:8420/js.stripe.com/v3/"
    settings.STRIPE_API_BASE = "http://127.0.0.1:8420"
    policy = client.get(reverse("home"))["Content-Security-Policy"]
    assert re.search(r"script-src 'self' 'nonce-[^']+' http://127\.0\.0\.1:8420;", policy)
    assert "frame-src 'self' http://127.0.0.1:8420;" in policy
    settings.STRIPE_JS_URL = "https://js.stripe.com/v3/"
    policy = client.get(reverse("home"))["Content-Security-Policy"]
    assert "https://js.stripe.com" in policy and "https://hooks.stripe.com" in policy
    settings.STRIPE_SECRET_KEY = ""
    assert "stripe" not in client.get(reverse("home"))["Content-Security-Policy"]


def test_routed_queues_are_declared_so_a_worker_without_q_takes_every_task(tmp_path):
    code = ("import django; django.setup(); from marketplace.celery import app; "
            "print(' '.join(sorted(app.amqp.queues)))")
    done = _django(tmp_path, "-c", code, GPUMARKET_CELERY_QUEUES="1")
    assert done.stdout.split() == ["celery", "leases", "ledger", "market"], done.stderr
    done = _django(tmp_path, "-c", code)
    assert done.stdout.split() == ["celery"], done.stderr
