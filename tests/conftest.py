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
# every runner a test starts never pre-pulls the templates' images: they are on Docker Hub,
# and test traffic goes to 127.0.0.1 only (the pre-pull tests drive images.py directly)
os.environ["GPUMARKET_RUNNER_NO_PREFETCH"] = "1"
JUPYTER_IMAGE = "gpumarket/jupyter:local"  # scripts/build-jupyter-image.sh


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


@pytest.fixture(autouse=True)
def ledger_guard(request):
    """After every database test, the ledger's invariants must still hold: a code path
    that changes money or state without its journal entry fails loudly here, naming the
    violation. `@pytest.mark.ledger("ledger_only")` checks only the ledger's own
    invariants (tests that move money without a market); `@pytest.mark.ledger("violates")`
    is for the tests that break an invariant on purpose to see it caught."""
    if "_django_db_helper" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("_django_db_helper")  # set up first, so torn down after us
    yield
    marker = request.node.get_closest_marker("ledger")
    mode = marker.args[0] if marker else "all"
    if mode == "violates":
        return
    from settlement.checks import LEDGER_CHECKS, first_violation

    problem = first_violation(LEDGER_CHECKS if mode == "ledger_only" else None)
    if problem:
        pytest.fail(f"ledger invariant broken at the end of the test: {problem}")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Tests start up to 24 threads on the database at once (test_book_concurrency.py):
    give the test process's connection pool (GPUMARKET_DB_POOL) room for them, a patient
    wait, and idle connections back to the shared server soon."""
    from django.conf import settings

    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if pool:
        pool.update(max_size=max(pool["max_size"], 32), timeout=max(pool["timeout"], 60),
                    max_idle=30)


@pytest.fixture(scope="session", autouse=True)
def _through_pgbouncer(request):
    """GPUMARKET_TEST_PGBOUNCER=1 (`make test-pgbouncer`, CI): the whole session's database
    traffic, this process's and its children's, goes through a PgBouncer in transaction
    mode in front of the test database (tests/support/pgbouncer.py)."""
    if os.environ.get("GPUMARKET_TEST_PGBOUNCER") != "1":
        yield None
        return
    from tests.support.pgbouncer import PgBouncer, route_through

    request.getfixturevalue("django_db_setup")  # created directly; torn down after us
    from django.db import connections

    db = connections["default"].settings_dict
    bouncer = PgBouncer(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
    try:
        with route_through(bouncer):
            with request.getfixturevalue("django_db_blocker").unblock():
                connections["default"].ensure_connection()  # really through it, or stop
                assert connections["default"].connection.info.port == bouncer.port
                connections["default"].close()
            yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(autouse=True)
def _fresh_login_limits():
    """Each test starts with no login or signup counted (marketplace/api/throttles.py):
    the counters live in the cache (Redis, shared with the broker: only their keys go)."""
    from django.core.cache import cache

    backend = cache._cache if hasattr(cache, "_cache") else None
    if backend is not None and hasattr(backend, "get_client"):  # Redis
        client = backend.get_client(write=True)
        keys = list(client.scan_iter(match=cache.make_key("limit:*"), count=1000))
        if keys:
            client.delete(*keys)
    else:
        cache.clear()


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """A fast password hasher for every test (the factories set a password on every user)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session")
def ssh_image(docker_client) -> str:
    """The real sshd image (scripts/build-ssh-image.sh, built by CI's .ci/run)."""
    from tests.support.ssh import SSH_IMAGE, SSH_IMAGE_VERSION

    if Path("/usr/sbin/sshd").exists() and shutil.which("busybox"):
        subprocess.run([str(ROOT / "scripts" / "build-ssh-image.sh"), SSH_IMAGE], check=True,
                       stdout=subprocess.DEVNULL)
        return SSH_IMAGE
    try:
        labels = docker_client.images.get(SSH_IMAGE).labels or {}
    except Exception:
        labels = {}
    if labels.get("gpumarket.sshd-image") != SSH_IMAGE_VERSION:  # missing, or an older build
        if not (Path("/usr/sbin/sshd").exists() and shutil.which("busybox")):
            require_or_skip(f"image {SSH_IMAGE} missing (or older) and openssh-server or "
                            "busybox-static not installed: run scripts/build-ssh-image.sh as root")
        subprocess.run([str(ROOT / "scripts" / "build-ssh-image.sh"), SSH_IMAGE], check=True)
    return SSH_IMAGE


@pytest.fixture(scope="session")
def jupyter_image(docker_client, ssh_image) -> str:
    """The real JupyterLab image (scripts/build-jupyter-image.sh, built by CI's .ci/run;
    built here when missing: about 2 minutes, PyPI needed)."""
    try:
        docker_client.images.get(JUPYTER_IMAGE)
    except Exception:
        if shutil.which("python3") is None:
            require_or_skip(f"image {JUPYTER_IMAGE} missing and no python3 to build it from")
        done = subprocess.run([str(ROOT / "scripts" / "build-jupyter-image.sh"), JUPYTER_IMAGE],
                              capture_output=True, text=True)
        if done.returncode != 0:
            require_or_skip(f"image {JUPYTER_IMAGE} missing and scripts/build-jupyter-image.sh "
                            f"failed: {done.stderr.strip().splitlines()[-1:]}")
    return JUPYTER_IMAGE


@pytest.fixture
def lease_network(docker_client):
    """A user-defined bridge network of this test: dockerd here has no default bridge,
    and a container on this one has its ports published on 127.0.0.1 (docker-proxy)."""
    import uuid

    network = docker_client.networks.create(f"gpumarket-test-{uuid.uuid4().hex[:10]}",
                                            driver="bridge")
    yield network.name
    network.reload()
    for container in network.containers:
        container.remove(force=True)
    network.remove()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1, once per session, credentials enforced
    (tests/support/s3.py); stopped at the end."""
    from tests.support import s3

    try:
        proc, server = s3.start()
    except (OSError, RuntimeError) as exc:
        require_or_skip(f"moto_server (moto[server]) does not start: {exc}")
    yield server
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def image_registry(docker_client):
    """Debian's docker-registry on 127.0.0.1, once per session (tests/support/registry.py);
    stopped, and its storage removed, at the end."""
    from tests.support import registry

    if registry.registry_binary() is None:
        require_or_skip("docker-registry is not installed (apt-get install docker-registry)")
    try:
        server = registry.start()
    except (OSError, RuntimeError) as exc:
        require_or_skip(f"docker-registry does not start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def cold_image(image_registry):
    """cold_image(mib, layers=1) → the reference of a fresh image of that size pushed to
    the registry and absent from the engine; every one is removed locally afterwards."""
    import uuid

    from tests.support import registry

    made: list[str] = []

    def make(mib: int = 4, layers: int = 1) -> str:
        ref = registry.push_cold(image_registry, f"test/cold-{uuid.uuid4().hex[:10]}", mib,
                                 layers)
        made.append(ref)
        return ref

    yield make
    for ref in made:
        registry.remove_local(ref)
