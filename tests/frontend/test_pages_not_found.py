"""A 404 with DEBUG on (the demo) is the site's own: a friendly page, JSON under /api/,
never Django's technical 404 page (which lists the URL patterns)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

TECHNICAL = "You’re seeing this error because you have"


@pytest.mark.parametrize("debug", [True, False])
def test_not_found_is_friendly(client, settings, debug):
    settings.DEBUG = debug
    for path in ("/no/such/page/", "/auctions/987654/", "/markets/no-such-class/"):
        r = client.get(path)
        html = r.content.decode()
        assert r.status_code == 404, path
        assert TECHNICAL not in html and "URLconf" not in html, path
        assert 'id="not-found"' in html and "Not found" in html, path
        assert 'class="menu-toggle"' in html  # the site's own header
    r = client.get("/api/v1/no-such-thing/")
    assert r.status_code == 404 and r.json()["detail"]
    r = client.get("/api/v1/auctions/987654/")
    assert r.status_code == 404 and "detail" in r.json()
