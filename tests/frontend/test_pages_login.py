"""The pages' login and signup share the API's limits (marketplace/api/throttles.py):
one counter per client address for the login page and POST /api/v1/auth/token/, one per
username, one for signups; beyond them a 429 page with Retry-After."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from tests.support.api import client_for

pytestmark = pytest.mark.django_db

PASSWORD = "a fine long passphrase"


def page_login(username: str, password: str, address: str = "10.9.0.1"):
    return Client().post("/login/", {"username": username, "password": password},
                         REMOTE_ADDR=address)


def api_login(username: str, password: str, address: str = "10.9.0.1"):
    return client_for().post("/api/v1/auth/token/", {"username": username,
                             "password": password}, format="json", REMOTE_ADDR=address)


def assert_429_page(response) -> None:
    assert response.status_code == 429, response.status_code
    assert int(response["Retry-After"]) >= 1
    assert "Too many attempts" in response.content.decode()


def test_login_page_and_token_endpoint_share_the_address_limit():
    limit = int(settings.GPUMARKET_LOGIN_RATE.split("/")[0])
    for i in range(limit):
        r = (page_login if i % 2 else api_login)(f"guess{i}", "wrong")
        assert r.status_code == 400, r.status_code  # the page shows its form again
    assert_429_page(page_login("guess-last", "wrong"))
    assert api_login("guess-last", "wrong").status_code == 429
    assert page_login("guess-last", "wrong", address="10.9.0.2").status_code == 400


def test_failed_page_logins_lock_the_username_for_the_api_too():
    get_user_model().objects.create_user("dora", password=PASSWORD)
    for i in range(settings.GPUMARKET_LOGIN_LOCKOUT_FAILURES):
        assert page_login("dora", "wrong", address=f"10.8.0.{i}").status_code == 400
    assert_429_page(page_login("dora", PASSWORD, address="10.7.0.1"))
    assert api_login("dora", PASSWORD, address="10.7.0.2").status_code == 429


def test_a_good_page_login_still_logs_in():
    get_user_model().objects.create_user("erin", password=PASSWORD)
    r = page_login("erin", PASSWORD)
    assert r.status_code == 302
    assert page_login("erin", PASSWORD, address="10.6.0.9").status_code == 302


def test_signup_page_is_limited_per_address():
    limit = int(settings.GPUMARKET_SIGNUP_RATE.split("/")[0])
    for i in range(limit):
        r = Client().post("/signup/", {"username": f"page{i}", "password1": PASSWORD,
                                       "password2": PASSWORD}, REMOTE_ADDR="10.5.5.5")
        assert r.status_code == 302, r.content[:500]
    r = Client().post("/signup/", {"username": "page-more", "password1": PASSWORD,
                                   "password2": PASSWORD}, REMOTE_ADDR="10.5.5.5")
    assert_429_page(r)
    assert not get_user_model().objects.filter(username="page-more").exists()


def admin_login(username: str, password: str, address: str = "10.6.0.1"):
    return Client().post("/admin/login/", {"username": username, "password": password,
                                           "next": "/admin/"}, REMOTE_ADDR=address)


def test_the_admin_login_shares_the_address_limit():
    get_user_model().objects.create_user("staffer", password=PASSWORD, is_staff=True)
    limit = int(settings.GPUMARKET_LOGIN_RATE.split("/")[0])
    for i in range(limit):
        assert admin_login(f"guess{i}", "wrong").status_code == 200  # the form again
    refused = admin_login("staffer", PASSWORD)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert page_login("staffer", PASSWORD, address="10.6.0.1").status_code == 429
    assert admin_login("staffer", PASSWORD, address="10.6.0.2").status_code == 302


def test_failed_admin_logins_lock_the_username_everywhere():
    get_user_model().objects.create_user("staffy", password=PASSWORD, is_staff=True)
    for i in range(settings.GPUMARKET_LOGIN_LOCKOUT_FAILURES):
        assert admin_login("staffy", "wrong", address=f"10.5.0.{i}").status_code == 200
    assert admin_login("staffy", PASSWORD, address="10.4.0.1").status_code == 429
    assert api_login("staffy", PASSWORD, address="10.4.0.2").status_code == 429
