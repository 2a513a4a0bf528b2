"""A 404 is a friendly page (pages) or JSON (/api/), never Django's yellow debug page, with
DEBUG on (the demo) as with it off (frontend/not_found.py, marketplace/api/errors.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.factories import ensure_catalog, funded_buyer

pytestmark = pytest.mark.django_db

DEBUG_PAGE = ("Using the URLconf", "technical_404", "Django tried these URL patterns",
              "You’re seeing this error because you have")


@pytest.mark.parametrize("debug", [True, False])
def test_an_unknown_page_is_a_friendly_404(client, settings, debug):
    settings.DEBUG = debug
    answer = client.get("/no-such-page/")
    html = answer.content.decode()
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("text/html")
    assert "<h1>Page not found</h1>" in html
    assert '<code id="not-found-path">/no-such-page/</code>' in html
    assert f'href="{reverse("home")}"' in html  # a way back, in the site's own header
    assert not any(marker in html for marker in DEBUG_PAGE)


@pytest.mark.parametrize("debug", [True, False])
def test_a_view_that_finds_nothing_answers_the_same_page(client, settings, debug):
    settings.DEBUG = debug
    ensure_catalog()
    client.force_login(funded_buyer(1))
    for url in (reverse("market", args=["no-such-gpu"]), reverse("auction", args=[999999]),
                reverse("lease-stop-page", args=[999999])):
        answer = client.get(url)
        html = answer.content.decode()
        assert answer.status_code == 404, url
        assert "<h1>Page not found</h1>" in html, url
        assert "Signed in as" in html  # the page knows its user
        assert not any(marker in html for marker in DEBUG_PAGE), url


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("path", ["/api/v1/no-such-thing/", "/api/nothing",
                                  "/api/v1/auctions/999999/"])
def test_under_api_a_404_is_json(client, settings, debug, path):
    settings.DEBUG = debug
    answer = client.get(path)
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert set(answer.json()) == {"detail"}


def test_a_missing_slash_still_redirects(client):
    assert client.get("/auctions").status_code == 301
