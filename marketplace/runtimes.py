"""What a node can run: its runner announces its runtime in every heartbeat
(providers/runner/agent.py → Node.runtime): `docker` runs the bid's image (its own
command when the bid gives none), `process` (`gpumarket-runner run --runtime process`)
runs the bid's command as a local process and cannot run an image's own command. So a
bid without a command never fills on a process-only node: the engine skips such asks
(engine.Bid.image_only / engine.Ask.runs_images), a sealed bid on such a lot is refused,
and a bid that no node of its market could run is refused naming `command` before it
rests. Rules: docs/MATCHING.md, "Runtimes"."""

from __future__ import annotations

from providers.models import Node

PROCESS = "process"


def runs_images(runtime: str | None) -> bool:
    """Whether a runner with this runtime runs container images: every runtime but
    `process`; unknown ("", never heard) counts as Docker, the runner's default."""
    return runtime != PROCESS


def can_run(runtime: str | None, command) -> bool:
    """Whether a node with `runtime` can run a workload with `command` (None or []: the
    image's own command)."""
    return bool(command) or runs_images(runtime)


def needs_command(where: str) -> str:
    """The refusal of a bid without a command where only process-runtime nodes are."""
    return (f"is needed here: {where} runs workloads as local processes (the runner's "
            "--runtime process), which cannot run an image's own command; give a command "
            "(or bid in a market with a Docker node)")


def market_runs_images(market_id: int) -> bool:
    """Whether some node in service with listed units in the market runs images (or has
    not said yet); False only when every such node is process-only. No node at all: True
    (a bid may rest until one comes)."""
    runtimes = set(Node.objects.filter(gpus__gpu_class_id=market_id, retired_at__isnull=True)
                   .values_list("runtime", flat=True).distinct())
    return not runtimes or any(runs_images(r) for r in runtimes)
