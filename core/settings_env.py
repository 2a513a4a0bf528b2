"""StrictEnv: django-environ's Env, but a number or yes/no setting that does not parse is
refused at startup naming the variable (ImproperlyConfigured), instead of a bare
ValueError traceback (int) or a silent False (bool: django-environ reads "maybe" as no)."""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

_FALSE = ("false", "off", "no", "n", "0", "")  # empty: no, as django-environ reads it


def _shown(value: str) -> str:
    """The refused value for the message: control characters out, at most 40 characters."""
    clean = "".join(c if c.isprintable() else "?" for c in value)
    return repr(clean if len(clean) <= 40 else clean[:40] + "…")


class StrictEnv(environ.Env):
    """Env whose int, float and bool refuse what does not parse (the variable named)."""

    def _raw(self, var: str) -> str | None:
        value = self.ENVIRON.get(var)
        return None if value is None else str(value)

    def int(self, var, default=environ.Env.NOTSET):
        raw = self._raw(var)
        if raw is None:
            return super().int(var, default=default)
        try:
            return int(raw.strip())
        except ValueError:
            raise ImproperlyConfigured(
                f"{var} must be a whole number, not {_shown(raw)}") from None

    def float(self, var, default=environ.Env.NOTSET):
        raw = self._raw(var)
        if raw is None:
            return super().float(var, default=default)
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
        if value is None or value != value or value in (float("inf"), float("-inf")):
            raise ImproperlyConfigured(f"{var} must be a number, not {_shown(raw)}")
        return value

    def bool(self, var, default=environ.Env.NOTSET):
        raw = self._raw(var)
        if raw is None:
            return super().bool(var, default=default)
        word = raw.strip().lower()
        if word in self.BOOLEAN_TRUE_STRINGS:
            return True
        if word in _FALSE:
            return False
        raise ImproperlyConfigured(
            f"{var} must be yes or no (1/0, true/false, on/off), not {_shown(raw)}")
