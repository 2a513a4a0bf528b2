"""Waiting on something observable: poll a predicate until it holds, with a timeout that
fails the test naming what was awaited (never a counted sleep)."""

from __future__ import annotations

import time


def wait_until(what: str, check, timeout: float = 30.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
