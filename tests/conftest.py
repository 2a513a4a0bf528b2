"""Shared fixtures: real services only.

Docker: `docker_client` answers with a live Docker Engine client and the local
test image (`gpumarket/busybox:local`, built by scripts/build-test-image.sh with
no registry). When no engine answers the test is skipped with the reason shown;
with GPUMARKET_REQUIRE_ALL=1 (as in CI) that skip becomes a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
TEST_IMAGE = os.environ.get("GPUMARKET_TEST_IMAGE", "gpumarket/busybox:local")


def require_or_skip(reason: str) -> None:
    """Skip with `reason`, or fail when GPUMARKET_REQUIRE_ALL=1 asks for every test to run."""
    if os.environ.get("GPUMARKET_REQUIRE_ALL") == "1":
        pytest.fail(f"GPUMARKET_REQUIRE_ALL=1 but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "no Docker here"
        require_or_skip(f"no Docker Engine answers ({exc.__class__.__name__}); start dockerd")
    try:
        client.images.get(TEST_IMAGE)
    except Exception:
        script = ROOT / "scripts" / "build-test-image.sh"
        if shutil.which("busybox") is None:
            require_or_skip(f"test image {TEST_IMAGE} missing and busybox-static not installed")
        subprocess.run([str(script), TEST_IMAGE], check=True)
    return client


@pytest.fixture(scope="session")
def test_image(docker_client) -> str:
    return TEST_IMAGE
