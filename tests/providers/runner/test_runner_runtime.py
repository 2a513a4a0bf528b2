"""Lease runtimes against the real Docker Engine and real local processes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from providers.runner.process_runtime import DEFAULT_UIDS, pids_of_uid
from providers.runner.runtime import DockerRuntime, ProcessRuntime, RuntimeFailure
from tests.conftest import require_or_skip

from .runner_helpers import LEASE_UUIDS as UUIDS
from .runner_helpers import lease_for as lease
from .runner_helpers import wait_for


@pytest.mark.docker
def test_docker_start_is_labelled_idempotent_and_readopted(docker_client, test_image, docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    container_id = runtime.start(lease(41, test_image, ["sleep", "30"]))

    attrs = docker_client.api.inspect_container(container_id)
    assert attrs["Config"]["Labels"]["gpumarket.lease"] == "41"
    assert attrs["Config"]["Labels"]["gpumarket.node"] == docker_node
    env = dict(item.split("=", 1) for item in attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert env["GPUMARKET_LEASE_ID"] == "41"
    assert attrs["HostConfig"]["NetworkMode"] == "none"
    assert attrs["HostConfig"]["Init"] is True
    assert not attrs["HostConfig"].get("DeviceRequests")  # simulate: no GPU device request
    assert attrs["State"]["Running"]

    # Starting again returns the same container; never a second one.
    assert runtime.start(lease(41, test_image, ["sleep", "30"])) == container_id
    labelled = docker_client.containers.list(all=True, filters={"label": "gpumarket.lease=41"})
    assert [c.id for c in labelled if c.labels["gpumarket.node"] == docker_node] == [container_id]

    # A fresh runtime (the runner restarted) re-adopts it by label.
    again = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    assert again.list_leases() == {41: container_id}
    assert again.start(lease(41, test_image, ["sleep", "30"])) == container_id
    assert again.exit_status(41) is None

    again.stop(41, grace_s=1)
    assert again.list_leases() == {}
    assert not docker_client.containers.list(all=True, filters={"id": container_id})


@pytest.mark.docker
def test_docker_exit_status_and_missing_image(docker_client, test_image, docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    runtime.start(lease(42, test_image, ["sh", "-c", "exit 3"]))
    assert wait_for(lambda: runtime.exit_status(42) is not None)
    assert runtime.exit_status(42) == 3
    runtime.stop(42, grace_s=0)
    with pytest.raises(RuntimeFailure, match="no container"):
        runtime.exit_status(42)
    with pytest.raises(RuntimeFailure, match="Docker"):
        runtime.start(lease(43, "gpumarket/does-not-exist:never", ["true"]))


def test_process_runtime_start_list_readopt_stop(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    handle = runtime.start(lease(7, "ignored", ["sleep", "30"]))
    assert handle.startswith("pid-")
    assert runtime.start(lease(7, "ignored", ["sleep", "30"])) == handle  # never two
    assert runtime.list_leases() == {7: handle}
    assert runtime.exit_status(7) is None

    again = ProcessRuntime(tmp_path)  # a restarted runner finds it in the state dir
    assert again.list_leases() == {7: handle}
    # with its GPUs (the release check needs them: gpu_processes.py)
    assert [w["gpus"] for w in again.describe()] == [",".join(UUIDS)]
    assert again.exit_status(7) is None
    again.stop(7, grace_s=2)
    assert again.list_leases() == {}
    pid = int(handle.removeprefix("pid-"))
    wait_for(lambda: not _alive(pid))  # the process group got SIGTERM


def test_process_runtime_reports_exit_codes(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    runtime.start(lease(8, "ignored", ["sh", "-c", 'test "$NVIDIA_VISIBLE_DEVICES" = "' +
                                       ",".join(UUIDS) + '" && exit 4']))
    assert wait_for(lambda: runtime.exit_status(8) is not None)
    assert runtime.exit_status(8) == 4
    runtime.stop(8)
    assert runtime.list_leases() == {}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_process_runtime_isolates_the_user_environment_and_files(tmp_path, monkeypatch):
    """Issue 10, item 1: as root, a lease runs as a uid of its own with a clean environment
    in a working directory outside the 0700 state dir; stopping it reaches every process of
    that uid (one that left the process group too) and removes what it left behind."""
    if os.geteuid() != 0:
        require_or_skip("the process runtime gives each lease a user of its own only as root")
    monkeypatch.setenv("GPUMARKET_RUNNER_TOKEN", "gmr_the_runner_must_keep_this")
    state = tmp_path / "state"
    runtime = ProcessRuntime(state)
    script = ("echo uid=$(id -u) groups=$(id -G) pwd=$(pwd); env; echo ---; ls $1 2>&1; "
              "touch /tmp/gpumarket-leftover-$$; (setsid sleep 300 &); echo READY; "
              "exec sleep 300")
    runtime.start(lease(9, "ignored", ["sh", "-c", script, "sh", str(state)]))
    out = wait_for(lambda: "READY" in runtime.logs(9) and runtime.logs(9))
    [entry] = json.loads((state / "processes" / "processes.json").read_text()).values()
    uid = entry["uid"]
    assert uid in DEFAULT_UIDS and f"uid={uid} groups={uid} " in out, out
    home = Path(entry["home"])
    assert f"pwd={home}" in out and not home.is_relative_to(state)
    env = dict(line.split("=", 1) for line in out.split("---")[0].splitlines()[1:]
               if "=" in line)
    assert "GPUMARKET_RUNNER_TOKEN" not in env and "gmr_" not in out
    assert env["HOME"] == str(home) and env["GPUMARKET_LEASE_ID"] == "9"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert "Permission denied" in out.split("---")[1]
    for path, mode in ((state, 0o700), (state / "processes", 0o700),
                       (state / "processes" / "processes.json", 0o600),
                       (Path(entry["log"]), 0o600), (home, 0o700)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    assert home.stat().st_uid == uid
    assert len(pids_of_uid(uid)) >= 2  # the shell's sleep and the one that left the group

    runtime.stop(9, grace_s=1)
    assert pids_of_uid(uid) == []
    assert not home.parent.exists()
    assert not [p for p in Path("/tmp").glob("gpumarket-leftover-*") if p.stat().st_uid == uid]
    assert runtime.list_leases() == {}
