"""marketplace.settings plus a URL that always fails (tests.support.boom_urls), for the
tests that need an unexpected error in a real server (tests/marketplace/test_logs.py).
Plain HTTP on 127.0.0.1: no HTTPS redirect whatever the production default."""

from marketplace.settings import *  # noqa: F403

ROOT_URLCONF = "tests.support.boom_urls"
SECURE_SSL_REDIRECT = False
