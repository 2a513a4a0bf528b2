"""The gpumarket-runner CLI, run as a real subprocess (`python -m providers.runner`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from tests.support.waiting import wait_until

from .runner_helpers import A10, H100, ROOT, TOKEN, TRUNCATED

UUID0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"


def runner(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    return subprocess.run(
        [sys.executable, "-m", "providers.runner", *args], cwd=ROOT, capture_output=True,
        text=True, timeout=timeout, env={**clean, **(env or {})},
    )


def test_inventory_simulate_prints_the_gpus():
    done = runner("inventory", "--simulate", str(H100))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "8 \u00d7 NVIDIA H100 80GB HBM3 (h100-sxm-80gb), driver 535.183.01, CUDA 12.2"
    )
    assert len(lines) == 9
    assert UUID0 in lines[1]
    assert "81559 MiB" in lines[1]
    assert "00000000:53:00.0" in lines[1]
    as_json = json.loads(runner("inventory", "--json", "--simulate", str(A10)).stdout)
    assert as_json["gpus"][0]["gpu_class"] == "a10"


def test_no_driver_and_no_simulate_exits_2():
    # This host has no NVIDIA driver: NVML really fails here.
    done = runner("inventory")
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("gpumarket-runner: no NVIDIA driver found (NVML: ")
    assert "pass --simulate FILE with a recorded `nvidia-smi -q` dump" in line


def test_truncated_dump_exits_2_naming_file_and_line():
    done = runner("inventory", "--simulate", str(TRUNCATED))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "h100-80gb-hbm3-x8.truncated.txt:86: corrupted lines 86-88" in line
    assert "Traceback" not in done.stderr


def test_missing_dump_file_exits_2(tmp_path):
    done = runner("inventory", "--simulate", str(tmp_path / "nope.txt"))
    assert done.returncode == 2
    assert "nope.txt:1: cannot read the file: No such file or directory" in done.stderr


def test_register_saves_private_config_and_never_prints_the_token(marketplace, tmp_path):
    state = tmp_path / "state"
    done = runner("register", "--url", marketplace.url, "--simulate", str(H100),
                  "--state-dir", str(state), env={"GPUMARKET_RUNNER_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "registered node test-node: 8 \u00d7 NVIDIA H100 80GB HBM3 (h100-sxm-80gb), "
        "driver 535.183.01, CUDA 12.2"
    )
    config_file = state / "config.json"
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    config = json.loads(config_file.read_text())
    assert config["url"] == marketplace.url
    assert config["token"] == TOKEN
    assert config["simulate"] == str(H100)
    assert TOKEN not in done.stdout + done.stderr
    [inventory] = marketplace.inventories
    assert inventory["gpus"][0]["uuid"] == UUID0
    assert inventory["source"] == "simulate:h100-80gb-hbm3-x8.driver-535.183.01.txt"


def test_refused_token_exits_3(marketplace, tmp_path):
    done = runner("register", "--url", marketplace.url, "--token", "not-the-token",
                  "--simulate", str(A10), "--state-dir", str(tmp_path))
    assert done.returncode == 3
    assert done.stderr.strip() == (
        "gpumarket-runner: the marketplace does not know this runner token (401): use the "
        "token shown once when the node was created (POST /api/v1/nodes/), or the newest one "
        "if it was rotated since (provider portal, or POST /api/v1/nodes/<id>/rotate-token/)"
    )
    assert not (tmp_path / "config.json").exists()
    # the process runtime takes no --token on the command line (any local process reads it)
    run = runner("run", "--url", marketplace.url, "--simulate", str(A10), "--state-dir",
                 str(tmp_path), "--runtime", "process",
                 env={"GPUMARKET_RUNNER_TOKEN": "not-the-token"})
    assert run.returncode == 3
    assert "not-the-token" not in run.stdout + run.stderr
    assert run.stderr.strip() == (
        "gpumarket-runner: the marketplace refused the runner token (401): it was rotated "
        "(provider portal, or POST /api/v1/nodes/<id>/rotate-token/) or the node was deleted; "
        "pass the new token in GPUMARKET_RUNNER_TOKEN instead (restarting with the old token "
        "does not help)")


def test_the_process_runtime_refuses_a_token_on_the_command_line(marketplace, tmp_path):
    """`ps` shows every process's command line to every local user: a lease process would
    read a --token there. Refused before anything is contacted."""
    run = runner("run", "--url", marketplace.url, "--token", TOKEN, "--simulate", str(A10),
                 "--state-dir", str(tmp_path), "--runtime", "process")
    assert run.returncode == 1
    assert run.stderr.startswith("gpumarket-runner: --token on the command line is readable "
                                 "by every process of this host"), run.stderr
    assert "GPUMARKET_RUNNER_TOKEN" in run.stderr and TOKEN not in run.stdout + run.stderr
    assert marketplace.inventories == []


def test_unreachable_marketplace_exits_1(tmp_path):
    done = runner("register", "--url", "http://127.0.0.1:9", "--token", TOKEN,
                  "--simulate", str(A10), "--state-dir", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.startswith("gpumarket-runner: the marketplace at http://127.0.0.1:9 ")


@pytest.mark.docker
def test_run_starts_a_lease_and_sigterm_leaves_it_running(
    marketplace, docker_client, test_image, tmp_path
):
    registered = runner("register", "--url", marketplace.url, "--token", TOKEN,
                        "--simulate", str(H100), "--state-dir", str(tmp_path))
    assert registered.returncode == 0, registered.stderr
    marketplace.add_lease(21, [UUID0], image=test_image, command=["sleep", "60"])
    node_label = f"gpumarket.node={marketplace.node['id']}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(tmp_path),
         "--poll-interval", "0.3", "--network", "none"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean,
    )
    try:
        deadline = time.monotonic() + 20
        while len(marketplace.events_for(21)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        [container] = docker_client.containers.list(all=True, filters={"label": node_label})
        assert container.status == "running"  # SIGTERM stops the loop, not the leases
        assert [e["status"] for e in marketplace.events_for(21)] == ["starting", "running"]
        assert marketplace.events_for(21)[1]["container_id"] == container.id
        assert f"lease 21: started container {container.id[:12]} on GPU-566e6f65…" in out
        assert "received SIGTERM" in out
        assert TOKEN not in out + err
    finally:
        if proc.poll() is None:
            proc.kill()
        for container in docker_client.containers.list(all=True,
                                                       filters={"label": node_label}):
            container.remove(force=True)


def test_inventory_of_a_mig_host_lists_its_slices_and_why_some_are_missing():
    dumps = ROOT / "data" / "nvidia-smi"
    done = runner("inventory", "--simulate",
                  str(dumps / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("  GPU 0  00000000:00:09.0  GPU-00000000-0000-0000-0000-")
    assert lines[1].endswith("MIG Enabled: 1 \u00d7 3g.40gb, 1 \u00d7 2g.20gb, 2 \u00d7 1g.10gb")
    assert lines[2].split() == ["MIG", "0", "MIG-00000000-0000-0000-0000-000000000000",
                                "3g.40gb", "GI", "2", "CI", "0", "40448", "MiB", "60", "SMs"]
    assert len(lines) == 6
    done = runner("inventory", "--simulate", str(dumps / "a100-sxm4-80gb-mig-x1of4.telegraf.xml"))
    assert done.returncode == 0, done.stderr
    assert "MIG Enabled: no MIG devices listed" in done.stdout
    assert "note: GPU 00000000:01:00.0: 4 MIG device(s) left out" in done.stdout


def test_inventory_simulates_a_directory_holding_a_pair(tmp_path):
    dumps = ROOT / "data" / "nvidia-smi"
    base = "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01"
    shutil.copy(dumps / f"{base}.q-idle.txt", tmp_path / "host.q.txt")
    shutil.copy(dumps / f"{base}.L.txt", tmp_path / "host.L.txt")
    done = runner("inventory", "--simulate", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "(source: simulate:host.q.txt)" in done.stdout
    assert "MIG 3  MIG-00000003-0000-0000-0000-000000000003  1g.10gb" in done.stdout
    (tmp_path / "host.L.txt").write_text("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n")
    done = runner("inventory", "--simulate", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith("gpumarket-runner: malformed nvidia-smi dump: host.L.txt:1: ")


@pytest.mark.docker
def test_run_on_a_shared_network_warns_that_its_leases_reach_each_other(
        marketplace, docker_client, tmp_path):
    registered = runner("register", "--url", marketplace.url, "--token", TOKEN,
                        "--simulate", str(H100), "--state-dir", str(tmp_path))
    assert registered.returncode == 0, registered.stderr
    log = tmp_path / "run.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(tmp_path),
             "--poll-interval", "0.3", "--no-push", "--network", "trial1net"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=clean)
    try:
        assert wait_until("the warning", lambda: "WARNING" in log.read_text(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert ("WARNING: every lease on the network trial1net can reach the others' ports"
            in text) and "--network per-lease" in text


@pytest.mark.docker
def test_run_says_when_this_host_does_not_isolate_lease_networks(marketplace, docker_client,
                                                                 tmp_path):
    """doctor's "lease isolation" verdict of this host, printed by `run` where the provider
    looks: a WARNING with the fix when the host routes between lease bridges (CI's dockerd,
    --iptables=false with ip_forward=1), nothing when it isolates them."""
    from providers.runner.lease_network import isolation_check

    registered = runner("register", "--url", marketplace.url, "--token", TOKEN,
                        "--simulate", str(H100), "--state-dir", str(tmp_path))
    assert registered.returncode == 0, registered.stderr
    log = tmp_path / "run.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(tmp_path),
             "--poll-interval", "0.3", "--no-push"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=clean)
    try:
        # the start line comes after the network checks
        assert wait_until("the runner's start line",
                          lambda: "gpumarket-runner " in log.read_text(), timeout=30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    isolated, detail, fix = isolation_check()
    if isolated is False:
        assert f"WARNING: lease isolation: {detail}" in text and fix in text
    else:
        assert "WARNING: lease isolation" not in text
