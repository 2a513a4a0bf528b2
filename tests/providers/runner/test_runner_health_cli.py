"""`doctor`, `status`, `benchmark` and the replay flags of `run`, as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from providers.runner.benchmark import run_benchmark

from .runner_helpers import H100, ROOT, TOKEN
from .test_runner_cli import runner

GPU0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"


def test_doctor_on_this_host_fails_the_driver_with_the_fix(docker_client, tmp_path):
    done = runner("doctor", "--state-dir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL  NVIDIA driver / NVML: ")  # no driver on this machine
    assert "fix: install the NVIDIA datacenter driver" in lines[0]
    assert lines[1].startswith("PASS  Docker Engine: version ")
    assert lines[2].startswith("FAIL  NVIDIA container runtime: ")
    assert "fix: install the NVIDIA Container Toolkit" in lines[2]
    # dockerd here runs --iptables=false with ip_forward=1: lease bridges are routed
    assert lines[3].startswith("FAIL  lease isolation: dockerd runs with --iptables=false")
    assert "fix: run dockerd with its iptables rules" in lines[3]
    assert lines[4].startswith("SKIP  marketplace connectivity and token: no marketplace")
    assert lines[5].startswith("SKIP  clock offset: ")
    assert lines[6] == "3 check(s) failed"


def test_doctor_checks_token_and_clock_against_the_marketplace(marketplace, tmp_path):
    good = runner("doctor", "--url", marketplace.url, "--token", TOKEN,
                  "--state-dir", str(tmp_path))
    lines = good.stdout.splitlines()
    assert f"PASS  marketplace connectivity and token: {marketplace.url} answers and " \
           "accepts the token" in lines
    [clock] = [line for line in lines if "clock offset" in line]
    assert clock.startswith("PASS  clock offset: ")
    bad = runner("doctor", "--url", marketplace.url, "--token", "wrong-token",
                 "--state-dir", str(tmp_path))
    assert bad.returncode == 1
    [refused] = [line for line in bad.stdout.splitlines() if "connectivity" in line]
    assert refused.startswith("FAIL  marketplace connectivity and token: ")
    assert "refused the runner token (401) — fix: re-register the node" in refused
    assert TOKEN not in good.stdout + bad.stdout and "wrong-token" not in bad.stdout
    down = runner("doctor", "--url", "http://127.0.0.1:9", "--token", TOKEN,
                  "--state-dir", str(tmp_path))
    assert "fix: check the URL, DNS, proxy and firewall" in down.stdout


def test_benchmark_without_a_gpu_reports_no_numbers():
    result = run_benchmark()
    assert (result.ran, result.backend, result.devices) == (False, None, [])
    assert result.reason.startswith("no GPU: benchmark not run")
    done = runner("benchmark")
    assert done.returncode == 2
    assert done.stdout.startswith("no GPU: benchmark not run")
    assert not any(ch.isdigit() for ch in done.stdout)  # not one figure
    as_json = json.loads(runner("benchmark", "--json").stdout)
    assert as_json["ran"] is False and as_json["devices"] == []


def test_replay_flags_need_simulate(tmp_path):
    done = runner("run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "--state-dir",
                  str(tmp_path), "--replay-health", '{"x": {}}')
    assert done.returncode == 1
    assert ("--replay-xid, --replay-health and --replay-process-left need --simulate FILE"
            in done.stderr)
    bad = runner("run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "--state-dir",
                 str(tmp_path), "--simulate", str(H100), "--replay-health",
                 '{"GPU-566e6f65-c38e-b12f-4824-6944218668b9": {"temp": 1}}')
    assert bad.returncode == 1
    assert "unknown reading(s) temp" in bad.stderr
    left = runner("run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "--state-dir",
                  str(tmp_path), "--simulate", str(H100), "--replay-process-left",
                  f'{{"{GPU0}": [{{"pid": "x"}}]}}')
    assert left.returncode == 1
    assert f"--replay-process-left {GPU0}[0].pid: a process id" in left.stderr


@pytest.mark.docker
def test_run_with_a_replayed_leftover_keeps_that_gpu_out_and_not_the_recorded_ones(
    marketplace, docker_client, test_image, tmp_path
):
    """The recorded process of the dump's third GPU is the baseline (a warning); the process
    replayed on GPU0 after its lease is left behind (fatal)."""
    held = "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"
    state = tmp_path / "state"
    assert runner("register", "--url", marketplace.url, "--token", TOKEN, "--simulate",
                  str(H100), "--state-dir", str(state)).returncode == 0
    marketplace.add_lease(61, [GPU0], image=test_image, command=["sleep", "60"],
                          duration_seconds=1)
    marketplace.add_lease(62, [held], image=test_image, command=["sleep", "60"],
                          duration_seconds=1)
    node_label = f"gpumarket.node={marketplace.node['id']}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(state),
         "--poll-interval", "0.3", "--heartbeat-interval", "0.3", "--network", "none",
         "--no-push", "--replay-process-left",
         f'{{"{GPU0}": [{{"pid": 4242, "name": "python", "used_mib": 1024}}]}}'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean,
    )

    def left_sent():
        beats = list(marketplace.heartbeats)
        return beats and any(f["rule"] == "process_left" for f in beats[-1].get("findings", []))

    try:
        deadline = time.monotonic() + 20
        while not (left_sent() and len(marketplace.events_for(62)) >= 3) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.terminate()
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert [e["status"] for e in marketplace.events_for(61)][-1] == "completed"
        assert [e["status"] for e in marketplace.events_for(62)][-1] == "completed"
        findings = {(f["uuid"], f["rule"], f["severity"])
                    for f in marketplace.heartbeats[-1]["findings"]}
        assert (GPU0, "process_left", "fatal") in findings
        assert (held, "process_foreign", "warn") in findings
        assert not any(u == held and s == "fatal" for u, _r, s in findings)
        assert (f"GPU {GPU0}: pid 4242 python (compute, 1024 MiB) still holds the GPU after "
                "lease 61's workload was removed") in out
    finally:
        if proc.poll() is None:
            proc.kill()
        for container in docker_client.containers.list(all=True, filters={"label": node_label}):
            container.remove(force=True)


@pytest.mark.docker
def test_run_with_replayed_xid_fails_the_lease_and_status_lists_the_rest(
    marketplace, docker_client, test_image, tmp_path
):
    state = tmp_path / "state"
    assert runner("register", "--url", marketplace.url, "--token", TOKEN, "--simulate",
                  str(H100), "--state-dir", str(state)).returncode == 0
    log = tmp_path / "kern.log"
    log.write_text((ROOT / "data" / "dmesg-with-xid-119.log").read_text()
                   .replace("PCI:0000:9b:00", "PCI:0000:53:00"))
    marketplace.add_lease(51, [GPU0], image=test_image, command=["sleep", "60"])
    marketplace.add_lease(52, ["GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"], image=test_image,
                          command=["sleep", "60"])
    node_label = f"gpumarket.node={marketplace.node['id']}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(state),
         "--poll-interval", "0.3", "--network", "none", "--replay-xid", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean,
    )
    try:
        deadline = time.monotonic() + 20
        while len(marketplace.events_for(52)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.terminate()
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        [event] = marketplace.events_for(51)  # failed at once, never started
        assert event["status"] == "failed"
        assert event["cause"].startswith(f"GPU {GPU0}: xid: XID 119 GSP_RPC_TIMEOUT")
        assert f"GPU {GPU0}: fatal: xid: XID 119" in out
        status = runner("status", "--state-dir", str(state))
        assert status.returncode == 0, status.stderr
        assert "token:       set (not shown)" in status.stdout
        assert TOKEN not in status.stdout
        assert "leases:      1 workload(s) in the docker runtime" in status.stdout
        assert "  lease 52  " in status.stdout and "running" in status.stdout
        assert "lease 51" not in status.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        for container in docker_client.containers.list(all=True, filters={"label": node_label}):
            container.remove(force=True)
