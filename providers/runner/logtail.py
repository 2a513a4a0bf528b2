"""A lease workload's log tail as the runner sends it (POST /api/v1/runner/leases/<id>/logs/).

The last LOG_LINES lines, at most LOG_MAX_BYTES of UTF-8 (the marketplace's limit), cut at
a line start, with the lease's secret values replaced by REDACTED (`lease_tail`); agent.py
sends them, switch.py sends the last one of a previous runtime's workload.
docs/RUNNER_PROTOCOL.md states the endpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

LOG_LINES = 200  # lines of a workload's output sent as its tail
LOG_MAX_BYTES = 64 * 1024  # the marketplace's limit for one tail
REDACTED = "[redacted]"
LINE_PART_MIN = 8  # a line of a multi-line secret this long is redacted on its own too


def redaction_values(secrets: Iterable[str]) -> list[str]:
    """What `redact` replaces for these secret values: each non-empty value, and each line
    of at least LINE_PART_MIN characters of a multi-line one (a PEM key cut by the tail's
    first line); longest first, so a value inside another goes with it."""
    found: set[str] = set()
    for value in secrets:
        if not value:
            continue
        found.add(value)
        if "\n" in value:
            found.update(line.strip() for line in value.splitlines()
                         if len(line.strip()) >= LINE_PART_MIN)
    return sorted(found, key=lambda v: (-len(v), v))


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of the secret values (redaction_values) replaced by
    REDACTED."""
    for value in redaction_values(secrets):
        text = text.replace(value, REDACTED)
    return text


def lease_tail(text: str, secrets: Iterable[str]) -> str:
    """The tail sent for a lease's output `text`: redacted, then trimmed (trim_tail)."""
    return trim_tail(redact(text, secrets))


def trim_tail(text: str, max_bytes: int = LOG_MAX_BYTES) -> str:
    """`text` without NUL characters, cut to its last `max_bytes` bytes of UTF-8 at a line
    start (or a character start when one line alone is longer)."""
    data = text.replace("\x00", "").encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    data = data[-max_bytes:]
    newline = data.find(b"\n")
    if 0 <= newline < len(data) - 1:
        data = data[newline + 1:]
    return data.decode("utf-8", "ignore")

