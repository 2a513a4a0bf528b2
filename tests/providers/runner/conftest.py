"""Fixtures for the runner tests: a stand-in marketplace, Docker cleanup.

These tests live in the package `tests.providers.runner` (tests/__init__.py exists), so they
never shadow the real `providers` package; helpers are in runner_helpers.py.
"""

from __future__ import annotations

import random

import pytest

from .runner_helpers import FakeMarketplace


@pytest.fixture
def marketplace():
    fake = FakeMarketplace()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def docker_node(docker_client):
    """A unique `gpumarket.node` label; every container carrying it is removed afterwards."""
    node = f"test-{random.randint(10**6, 10**7)}"
    yield node
    for container in docker_client.containers.list(
        all=True, filters={"label": f"gpumarket.node={node}"}
    ):
        container.remove(force=True)
