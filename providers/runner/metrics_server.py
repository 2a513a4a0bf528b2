"""`--metrics-port`: start the runner's /metrics server (metrics.py) or say why not."""

from __future__ import annotations

from .agent import print_line
from .config import CliError


def serve_metrics(agent, port: int | None, bind: str):
    """The runner's /metrics server (call .shutdown()), or None when --metrics-port is not
    given; CliError (exit 1) for a port out of range or one that cannot be bound."""
    if port is None:
        return None
    if not 1 <= port <= 65535:
        raise CliError(f"--metrics-port {port}: a TCP port is 1 to 65535")
    from . import metrics  # prometheus_client only when asked for

    try:
        server = metrics.serve(agent, port, bind)
    except OSError as exc:
        raise CliError(f"--metrics-port {port}: cannot listen on {bind}:{port}: "
                       f"{exc.strerror or exc}") from None
    print_line(f"metrics: http://{bind}:{port}/metrics (DCGM-exporter names)")
    return server
