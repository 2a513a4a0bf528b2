"""Which runtime `gpumarket-runner run` uses (switch.py), and the workloads a previous
runner left in the other one. The runner is a real subprocess against the stand-in
marketplace; Docker is the real engine; "no Docker" is a socket where nothing listens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from providers.runner.process_runtime import DEFAULT_UIDS, pids_of_uid
from providers.runner.runtime import ProcessRuntime, RuntimeFailure
from providers.runner.switch import pick_runtime
from tests.conftest import require_or_skip
from tests.support.containers import inspected

from .runner_helpers import A10, H100, LEASE_UUIDS, ROOT, wait_for

NO_DOCKER = "unix:///nonexistent.sock"


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    return {**clean, **extra}


@pytest.mark.parametrize("simulate", [False, True])
def test_auto_never_picks_the_process_runtime(monkeypatch, tmp_path, simulate):
    """A real node (and a simulated one) without a Docker Engine gets an error that names
    the choices, never local processes."""
    monkeypatch.setenv("DOCKER_HOST", NO_DOCKER)
    with pytest.raises(RuntimeFailure) as refused:
        pick_runtime("auto", tmp_path, "node-1", simulate=simulate,
                     token_on_command_line=False, uids=DEFAULT_UIDS)
    assert str(refused.value).startswith(f"no Docker Engine answers at {NO_DOCKER}")
    assert "`--runtime auto` runs lease workloads only in Docker containers" in str(refused.value)
    assert "--runtime process" in str(refused.value)
    assert not (tmp_path / "processes").exists()


def test_run_with_auto_and_no_docker_exits_1_before_contacting_anyone(marketplace, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "providers.runner", "run", "--url", marketplace.url,
         "--simulate", str(A10), "--state-dir", str(tmp_path)], cwd=ROOT,
        capture_output=True, text=True, timeout=30,
        env=_env(DOCKER_HOST=NO_DOCKER, GPUMARKET_RUNNER_TOKEN=marketplace.token))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"gpumarket-runner: no Docker Engine answers at {NO_DOCKER}")
    assert "never as local processes" in done.stderr
    assert marketplace.inventories == [] and marketplace.heartbeats == []


class _Run:
    """`gpumarket-runner run --runtime RUNTIME` on a registered state dir."""

    def __init__(self, state, runtime: str) -> None:
        self.out = state.parent / f"run-{runtime}.out"
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(state),
                 "--runtime", runtime, "--network", "none", "--poll-interval", "0.2",
                 "--grace", "1"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=_env())

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # workloads stay, for re-adoption
            try:
                self.proc.wait(timeout=15)
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
        return self.out.read_text()


def _failed(marketplace, lease_id: int) -> dict | None:
    return next((e for e in marketplace.events_for(lease_id) if e["status"] == "failed"), None)


@pytest.fixture
def leftovers(marketplace, docker_client, tmp_path):
    """After the test, whatever it failed to stop: the node's containers, its processes."""
    yield
    for container in inspected(docker_client,
                               label=[f"gpumarket.node={marketplace.node['id']}"]):
        container.remove(force=True)
    if (tmp_path / "state" / "processes" / "processes.json").exists():
        processes = ProcessRuntime(tmp_path / "state")
        for lease_id in processes.list_leases():
            processes.stop(lease_id, grace_s=0)


@pytest.mark.docker
def test_a_runtime_switch_stops_the_previous_runtimes_workloads(marketplace, docker_client,
                                                                test_image, tmp_path,
                                                                leftovers):
    """process → docker → process: each restarted runner reports the lease that ran in the
    other runtime `failed` (the buyer pays the seconds used) and stops its workload, which
    before ran on unwatched and unbilled."""
    if os.geteuid() != 0:
        require_or_skip("the process runtime runs leases only as root (or with --simulate "
                        "as the runner's user)")
    state = tmp_path / "state"
    registered = subprocess.run(
        [sys.executable, "-m", "providers.runner", "register", "--url", marketplace.url,
         "--token", marketplace.token, "--simulate", str(H100), "--state-dir", str(state)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env=_env())
    assert registered.returncode == 0, registered.stderr
    label = f"gpumarket.node={marketplace.node['id']}"

    # 1. a lease runs as a process; the runner stops, the process runs on
    marketplace.add_lease(51, LEASE_UUIDS, image=test_image, command=["sleep", "300"])
    first = _Run(state, "process")
    try:
        wait_for(lambda: len(marketplace.events_for(51)) >= 2, timeout=30)
    finally:
        out = first.stop()
    assert [e["status"] for e in marketplace.events_for(51)] == ["starting", "running"], out
    [entry] = json.loads((state / "processes" / "processes.json").read_text()).values()
    assert pids_of_uid(entry["uid"])

    # 2. restarted with Docker: the process is stopped and its lease reported failed
    marketplace.add_lease(52, LEASE_UUIDS[:1], image=test_image, command=["sleep", "300"])
    second = _Run(state, "docker")
    try:
        failed = wait_for(lambda: _failed(marketplace, 51), timeout=30)
        wait_for(lambda: len(marketplace.events_for(52)) >= 2, timeout=30)
    finally:
        out = second.stop()
    assert failed["cause"].startswith("the runner restarted with the docker runtime and "
                                      "stopped the lease's process workload pid-"), failed
    assert isinstance(failed["usage_seconds"], int)
    assert pids_of_uid(entry["uid"]) == []
    assert "left by a previous runner, stopped and removed" in out, out
    [container] = inspected(docker_client, label=[label])
    assert container.labels["gpumarket.lease"] == "52"  # 51 never started in Docker

    # 3. restarted with processes again: the container goes the same way
    third = _Run(state, "process")
    try:
        failed = wait_for(lambda: _failed(marketplace, 52), timeout=30)
        # listed while the runner removes it: tests/support/containers.inspected
        wait_for(lambda: not inspected(docker_client, label=[label]))
    finally:
        out = third.stop()
    assert failed["cause"].startswith("the runner restarted with the process runtime and "
                                      "stopped the lease's docker workload "), failed
    assert json.loads((state / "processes" / "processes.json").read_text()) == {}
