"""Listing test containers while a runner may be removing them."""

from __future__ import annotations

import docker


def inspected(client: docker.DockerClient, *, running_only: bool = False, **filters) -> list:
    """The containers matching `filters` (Docker's list filters, e.g. label=[…]), each
    inspected. docker-py's `containers.list()` lists ids and then inspects each one, so a
    container the runner removes in between raises NotFound from the listing itself;
    here such a container is simply not in the answer (it is gone)."""
    found = []
    for container in client.containers.list(all=not running_only, sparse=True,
                                            filters=filters):
        try:
            container.reload()
        except docker.errors.NotFound:
            continue
        found.append(container)
    return found
