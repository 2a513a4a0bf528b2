"""The lease contract's notice reaches the workload (docs/LEASE_CONTRACT.md): the notice
file in a read-only directory, the bid's signal, then SIGTERM and SIGKILL after the
lease's grace — with the real Docker Engine (busybox workloads, network none) and the
process runtime, against the stand-in marketplace (runner_helpers.FakeMarketplace)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.lease import RunnerLease
from providers.runner.notice import MAX_STOP_GRACE_SECONDS, bounded_grace
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime, ProcessRuntime

from .runner_helpers import A10, H100, ROOT, TOKEN, FakeMarketplace, iso, wait_for

UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9"]


class InspectableDocker(DockerRuntime):
    """The Docker runtime with one more bind mount, /ckpt (a test directory), so the test
    can read what the workload wrote after its container is gone; records each stop's
    grace."""

    def __init__(self, *args, ckpt, **kwargs):
        super().__init__(*args, **kwargs)
        self.ckpt, self.graces = ckpt, []

    def volumes_for(self, lease):
        return [*super().volumes_for(lease), f"{self.ckpt}:/ckpt:rw"]

    def stop(self, lease_id, grace_s=10):
        self.graces.append(grace_s)
        super().stop(lease_id, grace_s)


@pytest.fixture
def docker_agent(marketplace: FakeMarketplace, docker_client, docker_node, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.chmod(ckpt, 0o777)  # the container's user writes here
    runtime = InspectableDocker(docker_node, client=docker_client, network_mode="none",
                                simulate=True, ckpt=ckpt, notice_root=tmp_path / "notice")
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    lines: list[str] = []
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=30,
                  log=lines.append)
    yield agent, runtime, ckpt, lines
    client.close()


def _notice(reason: str = "preemption", seconds: int = 30) -> dict:
    now = datetime.now(UTC)
    return {"reason": reason, "deadline": iso(now + timedelta(seconds=seconds)),
            "since": iso(now)}


# On SIGUSR1 (the notice signal) it copies the notice and writes a checkpoint in five
# steps; on SIGTERM it makes sure the checkpoint is whole, then exits 0. The traps only set
# flags: the loop acts on them, so a SIGTERM during the checkpoint waits for its end. It
# also records what the notice directory holds and whether it can write there.
CHECKPOINTER = r"""
ckpt() {
  cp /run/gpumarket/notice /ckpt/notice.json
  i=0; while [ $i -lt 5 ]; do echo "step $i" >> /ckpt/state.part; i=$((i+1)); sleep 0.2; done
  mv /ckpt/state.part /ckpt/state.txt
}
trap 'usr1=1' USR1
trap 'term=1' TERM
ls -A /run/gpumarket > /ckpt/mount-before.txt
echo "$GPUMARKET_NOTICE_FILE" > /ckpt/env.txt
if touch /run/gpumarket/x 2>/dev/null; then echo writable; else echo read-only; fi > /ckpt/ro.txt
echo ready > /ckpt/ready
while :; do
  if [ -n "$usr1" ]; then usr1=; ckpt; fi
  if [ -n "$term" ]; then
    [ -f /ckpt/state.txt ] || ckpt; echo term-after-ckpt > /ckpt/exit; exit 0
  fi
  sleep 0.1
done
"""


@pytest.mark.docker
def test_a_warned_docker_workload_finishes_its_checkpoint_before_it_is_stopped(
        docker_agent, marketplace, test_image):
    agent, runtime, ckpt, lines = docker_agent
    marketplace.add_lease(41, UUIDS, image=test_image, command=["sh", "-c", CHECKPOINTER],
                          notice_signal="SIGUSR1", stop_grace_seconds=20, notice=None)
    agent.tick()
    wait_for(lambda: (ckpt / "ready").exists(), 20)
    assert (ckpt / "mount-before.txt").read_text() == ""  # nothing of the runner there
    assert (ckpt / "ro.txt").read_text().strip() == "read-only"
    assert (ckpt / "env.txt").read_text().strip() == "/run/gpumarket/notice"

    notice = _notice("preemption", seconds=1)
    marketplace.leases[41]["notice"] = notice
    agent.tick()  # the notice: the file, then SIGUSR1
    assert any("lease 41: notice (preemption" in line and "SIGUSR1 sent" in line
               for line in lines), lines
    host_file = runtime.notice_dir(41) / "notice"
    assert json.loads(host_file.read_text()) == {"lease_id": 41, **notice}
    agent.tick()  # the same notice again: not delivered twice
    assert sum("lease 41: notice (" in line for line in lines) == 1

    deadline = datetime.fromisoformat(notice["deadline"])
    wait_for(lambda: datetime.now(UTC) > deadline, 5)
    del marketplace.leases[41]  # the deadline came: the marketplace ended the lease
    agent.tick()  # SIGTERM at once; the workload finishes its checkpoint within the grace
    assert runtime.graces == [20]  # the lease's own grace, not the runner's 30 s
    assert runtime.list_leases() == {}
    assert (ckpt / "state.txt").read_text().splitlines() == [f"step {i}" for i in range(5)]
    assert (ckpt / "exit").read_text().strip() == "term-after-ckpt"
    # what it read when warned: the notice, not rewritten at the stop (its deadline came)
    assert json.loads((ckpt / "notice.json").read_text()) == {"lease_id": 41, **notice}
    assert not runtime.notice_dir(41).exists()  # removed with the container


# Polls the notice file (no signal named) and checkpoints when it appears; ignores SIGTERM
# and keeps ticking: only SIGKILL ends it.
STUBBORN = r"""
trap 'echo term >> /ckpt/ticks' TERM
echo ready > /ckpt/ready
while [ ! -f /run/gpumarket/notice ]; do sleep 0.1; done
cp /run/gpumarket/notice /ckpt/seen.json
while :; do echo tick >> /ckpt/ticks; sleep 0.1; done
"""


@pytest.mark.docker
def test_a_docker_workload_that_ignores_sigterm_is_killed_after_the_grace(
        docker_agent, marketplace, test_image):
    agent, runtime, ckpt, _lines = docker_agent
    marketplace.add_lease(42, UUIDS, image=test_image, command=["sh", "-c", STUBBORN],
                          stop_grace_seconds=1)
    agent.tick()
    wait_for(lambda: (ckpt / "ready").exists(), 20)
    marketplace.leases[42]["notice"] = _notice("maintenance")
    agent.tick()
    seen = json.loads(wait_for(lambda: (ckpt / "seen.json").exists()
                               and (ckpt / "seen.json").read_text(), 10))
    assert seen["reason"] == "maintenance" and seen["lease_id"] == 42

    del marketplace.leases[42]
    agent.tick()
    assert runtime.graces == [1]
    ticks = (ckpt / "ticks").read_text().splitlines()
    assert "term" in ticks  # it got SIGTERM and ignored it …
    assert "tick" in ticks[ticks.index("term") + 1:]  # … and ran on …
    assert runtime.list_leases() == {}  # … until SIGKILL: the container is gone


@pytest.mark.docker
def test_a_stop_without_notice_tells_the_workload_first(docker_agent, marketplace,
                                                        test_image):
    """The buyer's stop (the lease leaves the list at once): the notice, reason "stop"
    and deadline now, then SIGTERM."""
    agent, runtime, ckpt, _lines = docker_agent
    script = (r"trap 'cp /run/gpumarket/notice /ckpt/at-term.json; exit 0' TERM; "
              r"echo ready > /ckpt/ready; while :; do sleep 0.1; done")
    marketplace.add_lease(43, UUIDS, image=test_image, command=["sh", "-c", script])
    agent.tick()
    wait_for(lambda: (ckpt / "ready").exists(), 20)
    del marketplace.leases[43]
    agent.tick()
    told = json.loads((ckpt / "at-term.json").read_text())
    assert told["reason"] == "stop" and told["lease_id"] == 43
    assert told["deadline"] == told["since"]
    assert runtime.graces == [30]  # no stop_grace_seconds listed: the runner's --grace


# -- the process runtime ------------------------------------------------------------------

# Copies the notice on SIGUSR1; ignores SIGTERM and keeps printing ticks (its output is
# the runtime's log, which outlives it).
PROCESS_WORKLOAD = r"""
trap 'cp "$GPUMARKET_NOTICE_FILE" "$HOME/got.json"' USR1
trap 'echo term' TERM
touch "$(dirname "$GPUMARKET_NOTICE_FILE")/mine" 2>/dev/null && echo writable > "$HOME/ro"
echo ready > "$HOME/ready"
while :; do echo tick; sleep 0.1; done
"""


def test_the_process_runtime_delivers_the_notice_and_kills_after_the_grace(
        marketplace, tmp_path):
    runtime = ProcessRuntime(tmp_path / "state")
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    lines: list[str] = []
    agent = Agent(client, DumpGpus(A10), runtime, poll_interval=0.2, grace_s=30,
                  log=lines.append)
    try:
        marketplace.add_lease(44, UUIDS, image="ignored",
                              command=["/bin/sh", "-c", PROCESS_WORKLOAD],
                              notice_signal="SIGUSR1", stop_grace_seconds=1)
        agent.tick()
        [entry] = runtime._load().values()
        home, log = Path(entry["home"]), Path(entry["log"])
        wait_for(lambda: (home / "ready").exists(), 10)
        notice = _notice("maintenance")
        marketplace.leases[44]["notice"] = notice
        agent.tick()
        got = json.loads(wait_for(lambda: (home / "got.json").exists()
                                  and (home / "got.json").read_text(), 10))
        assert got == {"lease_id": 44, **notice}
        directory = runtime.notice_dir(44)
        assert sorted(os.listdir(directory)) == ["notice"]  # the workload wrote nothing
        if runtime.isolated:
            assert not (home / "ro").exists()
            assert oct(directory.stat().st_mode & 0o777) == "0o755"

        marketplace.leases[44]["notice"] = None  # withdrawn: the file goes
        agent.tick()
        assert not (directory / "notice").exists()
        assert any("lease 44: notice withdrawn" in line for line in lines)

        del marketplace.leases[44]
        agent.tick()  # SIGTERM (ignored), SIGKILL after 1 s
        assert runtime.list_leases() == {}
        assert not home.exists()  # removed with the workload
        output = log.read_text().splitlines()
        assert "term" in output  # it got SIGTERM and ignored it …
        assert "tick" in output[output.index("term") + 1:]  # … and ran on until SIGKILL
    finally:
        client.close()
        for lease_id in list(runtime.list_leases()):
            runtime.stop(lease_id, 0)


def test_the_payload_fields_parse_and_the_grace_is_bounded():
    lease = RunnerLease.parse({"id": 7, "notice": {"reason": "maintenance",
                                                   "deadline": "2030-01-01T00:00:00+00:00",
                                                   "since": "2029-12-31T23:58:00+00:00"},
                               "notice_signal": "SIGUSR2", "stop_grace_seconds": 45})
    assert lease.notice == {"reason": "maintenance", "deadline": "2030-01-01T00:00:00+00:00",
                            "since": "2029-12-31T23:58:00+00:00"}
    assert (lease.notice_signal, lease.stop_grace_seconds) == ("SIGUSR2", 45)
    assert RunnerLease.parse({"id": 8, "notice": {"reason": "x"}}).notice is None
    assert RunnerLease.parse({"id": 9}).notice is None
    assert bounded_grace(10_000) == MAX_STOP_GRACE_SECONDS
    assert bounded_grace(-5) == 0
    assert bounded_grace("10") is None and bounded_grace(True) is None


@pytest.mark.docker
def test_a_fatal_gpu_finding_tells_the_workload_before_its_stop(docker_agent, marketplace,
                                                                 test_image, tmp_path):
    """The real XID 119 lines of data/dmesg-with-xid-119.log, moved to the leased GPU's
    bus: the lease fails, and its workload reads reason "health" at SIGTERM."""
    agent, runtime, ckpt, _lines = docker_agent
    script = (r"trap 'cp /run/gpumarket/notice /ckpt/at-term.json; exit 0' TERM; "
              r"echo ready > /ckpt/ready; while :; do sleep 0.1; done")
    marketplace.add_lease(45, UUIDS, image=test_image, command=["sh", "-c", script])
    agent.tick()
    wait_for(lambda: (ckpt / "ready").exists(), 20)
    log = tmp_path / "kern.log"
    log.write_text((ROOT / "data" / "dmesg-with-xid-119.log").read_text()
                   .replace("PCI:0000:9b:00", "PCI:0000:53:00"))  # UUIDS[0] is on bus 53
    agent.gpus.replay_xid(log)
    agent.heartbeat_interval = 0.0
    agent._next_heartbeat = 0.0
    agent.tick()
    assert marketplace.events_for(45)[-1]["status"] == "failed"
    told = json.loads((ckpt / "at-term.json").read_text())
    assert told["reason"] == "health" and told["lease_id"] == 45
    assert runtime.list_leases() == {}


@pytest.mark.docker
def test_the_checkpoint_a_warned_workload_writes_is_uploaded_at_notice(
        marketplace, docker_client, docker_node, tmp_path, test_image, s3_server, monkeypatch):
    """With a checkpoint store (moto's S3 server, tests/support/s3.py): the notice, the
    workload's SIGUSR1 handler writes /workspace/checkpoint/state.txt, and the runner's
    upload after the settle time (shortened here) holds it, reason "notice"."""
    import random

    from providers.runner import reconcile
    from providers.runner.workspace import Workspaces

    monkeypatch.setattr(reconcile, "NOTICE_SETTLE_S", 0.5)
    bucket = s3_server.bucket(f"notice-{random.randint(10**5, 10**6)}")
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True, workspaces=Workspaces(tmp_path / "workspaces"),
                            notice_root=tmp_path / "notice")
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=5,
                  log=lambda _line: None)
    script = (r"trap 'mkdir -p /workspace/checkpoint; echo step-7 > "
              r"/workspace/checkpoint/state.txt' USR1; echo ready; "
              r"while :; do sleep 0.1; done")
    store = {"endpoint_url": s3_server.endpoint_url, "bucket": bucket, "prefix": "46/",
             "region": "", "access_key_id": s3_server.access_key_id,
             "secret_access_key": s3_server.secret_access_key,
             "path": "/workspace/checkpoint", "max_bytes": 1_000_000, "restore": False}
    try:
        marketplace.add_lease(46, UUIDS, image=test_image, command=["sh", "-c", script],
                              chain_id=46, checkpoint=store, notice_signal="SIGUSR1")
        agent.tick()
        wait_for(lambda: "ready" in runtime.logs(46, 5), 20)
        marketplace.leases[46]["notice"] = _notice("maintenance")
        agent.tick()
        agent.checkpoints.join(30)
        [at_notice] = marketplace.checkpoints[46]
        assert (at_notice["status"], at_notice["reason"]) == ("uploaded", "notice")
        key = at_notice["key"].removesuffix("manifest.json") + "files/state.txt"
        assert s3_server.read(bucket, key) == b"step-7\n"
    finally:
        for lease_id in list(runtime.list_leases()):
            runtime.stop(lease_id, 0)
        agent.checkpoints.join(30)
        client.close()
