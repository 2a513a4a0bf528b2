"""Login and signup limits: 429 with Retry-After, for the API and the pages alike.

- Per client address (DRF's get_ident: the connection's peer, or X-Forwarded-For behind
  REST_FRAMEWORK["NUM_PROXIES"] proxies): GPUMARKET_LOGIN_RATE attempts at the token
  endpoint and the login page together (scope "login"), GPUMARKET_SIGNUP_RATE signups
  through the API and the page (scope "signup"). Every attempt counts.
- Per username, from any address: GPUMARKET_LOGIN_LOCKOUT_FAILURES failed (or still
  running) logins within a window of GPUMARKET_LOGIN_LOCKOUT_SECONDS lock that username
  until the window ends, so an attacker can never lock a real user out for longer than
  one window at a time, and gets at most that many guesses per window.

The counters are windows (each starting at its first attempt) in the Django cache
(Redis when REDIS_URL is set, so all processes share them; else each process's
memory), counted with the cache's atomic add/incr: 60 concurrent attempts are 60
counts, not 60 reads of the same count. DRF throttle classes (LoginAddressThrottle,
SignupAddressThrottle) serve the API views; `check` and `begin_login` give the pages
(frontend/login.py) the same counters. A cache that does not answer lets the attempt
through (logged): logins stay possible.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

log = logging.getLogger("gpumarket.api")

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """"20/min" → (20, 60): a count per second, minute, hour or day (DRF's format)."""
    count, period = rate.split("/")
    return int(count), _PERIODS[period[0]]


def _hit(key: str, period: int) -> tuple[int, int, str]:
    """Count one more in `key`'s current window → (count in the window, seconds until it
    ends, the window's cache key). A window starts at the first count after the last one
    ended and lasts `period` seconds."""
    now = time.time()
    start = float(cache.get_or_set(f"limit:{key}", now, timeout=period))
    name = f"limit:{key}:{int(start * 1000)}"
    wait = max(1, math.ceil(start + period - now))
    cache.add(name, 0, timeout=period + 1)
    try:
        value = cache.incr(name)
    except ValueError:  # expired between add and incr
        cache.add(name, 1, timeout=period + 1)
        value = 1
    return value, wait, name


class _AddressThrottle(BaseThrottle):
    """Every request counts against the client address's window of the scope's rate."""

    scope = ""
    wait_seconds: int | None = None

    def allow_request(self, request, view) -> bool:
        limit, period = parse_rate(api_settings.DEFAULT_THROTTLE_RATES[self.scope])
        try:
            value, wait, _ = _hit(f"{self.scope}:{self.get_ident(request)}", period)
        except Exception:  # the cache is down: let it through rather than refuse every login
            log.warning("login limits: the cache did not answer; %s not limited", self.scope)
            return True
        self.wait_seconds = wait
        return value <= limit

    def wait(self) -> float | None:
        return self.wait_seconds


class LoginAddressThrottle(_AddressThrottle):
    """Logins per client address (GPUMARKET_LOGIN_RATE): token endpoint and login page."""

    scope = "login"


class SignupAddressThrottle(_AddressThrottle):
    """Signups per client address (GPUMARKET_SIGNUP_RATE): API and page."""

    scope = "signup"


def check(request, throttle_class: type[_AddressThrottle]) -> None:
    """Count `request` against `throttle_class`; raises Throttled (wait seconds) when over
    the limit (for the pages, which have no DRF view to do it)."""
    throttle = throttle_class()
    if not throttle.allow_request(request, None):
        raise Throttled(throttle.wait())


@dataclass
class LoginAttempt:
    """One login attempt counted against its username; `succeeded()` takes it back (only
    failed attempts lock a username)."""

    key: str | None

    def succeeded(self) -> None:
        if self.key is None:
            return
        try:
            cache.decr(self.key)
        except Exception:  # the window ended meanwhile (or the cache is down): nothing left
            log.debug("login limits: %s gone before a successful login's refund", self.key)


def begin_login(username: str) -> LoginAttempt:
    """Count an attempt to log in as `username` (any letter case, any address). Raises
    Throttled with the seconds left in the window when the username has had
    GPUMARKET_LOGIN_LOCKOUT_FAILURES failed attempts in it."""
    digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    try:
        value, wait, key = _hit(f"user:{digest}", settings.GPUMARKET_LOGIN_LOCKOUT_SECONDS)
    except Exception:
        log.warning("login limits: the cache did not answer; username lockout not checked")
        return LoginAttempt(None)
    if value > settings.GPUMARKET_LOGIN_LOCKOUT_FAILURES:
        raise Throttled(wait, detail="too many failed logins for this username; "
                                     "it is locked for a while")
    return LoginAttempt(key)
