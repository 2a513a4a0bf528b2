"""A lease workload's log tail as the runner sends it (POST /api/v1/runner/leases/<id>/logs/).

The last LOG_LINES lines, at most LOG_MAX_BYTES of UTF-8 (the marketplace's limit), cut at
a line start; agent.py sends them, switch.py sends the last one of a previous runtime's
workload. docs/RUNNER_PROTOCOL.md states the endpoint.
"""

from __future__ import annotations

LOG_LINES = 200  # lines of a workload's output sent as its tail
LOG_MAX_BYTES = 64 * 1024  # the marketplace's limit for one tail


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

