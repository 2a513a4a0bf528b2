"""A bid's `env` (plain) and `secrets` (sealed at rest, marketplace/sealing.py): the
variables its leases' workloads get. The bounds and names below are checked here, once,
for every way in (API, pages, services); no database access. docs/SECRETS.md.
"""

from __future__ import annotations

import re

from core.text import bad_character_message
from marketplace.errors import InvalidInput

NAME = re.compile(r"\A[A-Z_][A-Z0-9_]*\Z")
NAME_MAX = 128  # characters of one name
MAX_ENTRIES = 32  # names in env, and again in secrets
VALUE_MAX_BYTES = 4 * 1024  # UTF-8 bytes of one value
TOTAL_MAX_BYTES = 32 * 1024  # UTF-8 bytes of all names and values of env (or secrets)
RESERVED_PREFIXES = ("GPUMARKET_", "NVIDIA_")  # the runner's own (lease id, GPUs)


def clean_vars(values: dict | None, *, field: str) -> dict[str, str]:
    """`values` checked as `field` ("env" or "secrets"): a JSON object of at most
    MAX_ENTRIES names `[A-Z_][A-Z0-9_]*` (≤ NAME_MAX characters, none starting with a
    RESERVED_PREFIXES entry) to strings of at most VALUE_MAX_BYTES (no NUL), all of them
    at most TOTAL_MAX_BYTES. None → {}. Raises InvalidInput naming `field` or
    `field.NAME`; a message never repeats a value."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise InvalidInput("must be a JSON object of NAME: \"value\"", field=field)
    if len(values) > MAX_ENTRIES:
        raise InvalidInput(f"must have at most {MAX_ENTRIES} names", field=field)
    total = 0
    for name, value in values.items():
        if not isinstance(name, str) or not NAME.match(name) or len(name) > NAME_MAX:
            shown = repr(name[:64]) if isinstance(name, str) else "a key"
            raise InvalidInput(f"{shown} is not a name: names are capital letters, digits "
                               f"and '_', not starting with a digit, at most {NAME_MAX} "
                               "characters (such as HF_TOKEN)", field=field)
        where = f"{field}.{name}"
        if name.startswith(RESERVED_PREFIXES):
            raise InvalidInput(f"names starting with {' or '.join(RESERVED_PREFIXES)} are "
                               "reserved for the marketplace and the runner", field=where)
        if not isinstance(value, str):
            raise InvalidInput("must be a string", field=where)
        bad = bad_character_message(value)
        if bad is not None:
            raise InvalidInput(bad, field=where)
        size = len(value.encode())
        if size > VALUE_MAX_BYTES:
            raise InvalidInput(f"must be at most {VALUE_MAX_BYTES // 1024} KiB (UTF-8)",
                               field=where)
        total += size + len(name)
    if total > TOTAL_MAX_BYTES:
        raise InvalidInput(f"must be at most {TOTAL_MAX_BYTES // 1024} KiB in all (names "
                           "and values, UTF-8)", field=field)
    return dict(values)


def clean_env_and_secrets(env: dict | None, secrets: dict | None
                          ) -> tuple[dict[str, str], dict[str, str]]:
    """(env, secrets), each clean_vars'd, with no name in both (InvalidInput naming
    `secrets.NAME`)."""
    env, secrets = clean_vars(env, field="env"), clean_vars(secrets, field="secrets")
    both = sorted(env.keys() & secrets.keys())
    if both:
        raise InvalidInput("is in env too: a name is either plain or secret",
                           field=f"secrets.{both[0]}")
    return env, secrets
