"""docs/LEASE_CONTRACT.md's example handler, run as it stands: a lease workload of the
process runtime (the system's python3) that gets the notice and SIGUSR1 from the real
agent, checkpoints, exits 0 — and its next run resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.process_runtime import pids_of_uid
from providers.runner.runtime import ProcessRuntime

from .runner_helpers import A10, ROOT, TOKEN, iso, wait_for

PYTHON = "/usr/bin/python3"  # the lease's user may not reach the project's venv


def _catches(entry: dict, sig: int) -> bool:
    """Whether a process of the lease's user has a handler for `sig` (/proc SigCgt)."""
    for pid in pids_of_uid(entry["uid"]):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        mask = next(line.split()[1] for line in status.splitlines()
                    if line.startswith("SigCgt:"))
        if int(mask, 16) >> (sig - 1) & 1:
            return True
    return False


def example() -> str:
    text = (ROOT / "docs" / "LEASE_CONTRACT.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", text, re.S)
    return code


@pytest.fixture
def ckpt_dir():
    path = Path(tempfile.mkdtemp(prefix="gpumarket-contract-"))  # a lease user reaches it
    os.chmod(path, 0o777)  # the lease's own uid writes the checkpoint here
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not os.path.exists(PYTHON), reason="no system python3")
@pytest.mark.skipif(os.geteuid() != 0, reason="each lease as a user of its own needs root")
def test_the_documented_handler_checkpoints_when_warned_and_resumes(marketplace, tmp_path,
                                                                    ckpt_dir):
    runtime = ProcessRuntime(tmp_path / "state")
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    agent = Agent(client, DumpGpus(A10), runtime, poll_interval=0.2, grace_s=5,
                  log=lambda _line: None)
    state = ckpt_dir / "state.json"
    try:
        for lease_id in (51, 52):
            marketplace.add_lease(lease_id, ["GPU-566e6f65-c38e-b12f-4824-6944218668b9"],
                                  image="ignored", command=[PYTHON, "-c", example()],
                                  env={"CKPT_DIR": str(ckpt_dir)}, notice_signal="SIGUSR1")
            agent.tick()
            entry = runtime._load()[lease_id]
            log = Path(entry["log"])
            # a signal before the handler is installed has its default action (terminate):
            # the notice comes once the workload catches SIGUSR1, as the contract says
            wait_for(lambda e=entry: _catches(e, signal.SIGUSR1), 20)
            now = datetime.now(UTC)
            marketplace.leases[lease_id]["notice"] = {
                "reason": "maintenance", "deadline": iso(now + timedelta(seconds=60)),
                "since": iso(now)}
            before = json.loads(state.read_text())["step"] if state.exists() else 0
            agent.tick()  # the file and SIGUSR1: the handler checkpoints and exits 0
            wait_for(lambda: "checkpointed" in log.read_text(), 10)  # noqa: B023
            step = json.loads(state.read_text())["step"]
            assert step >= before  # the second run started from the first one's checkpoint
            assert f"checkpointed step {step}: maintenance" in log.read_text()
            # exited 0 by itself: reported completed and removed (this tick or the next)
            wait_for(lambda: agent.tick() or runtime.list_leases() == {}, 10)
            assert [e["status"] for e in marketplace.events_for(lease_id)][-1] == "completed"
            # each lease runs as a user of its own (umask 077): in production the
            # checkpoint store carries the state over; here the test lets the next read it
            os.chmod(state, 0o644)
        assert not list(ckpt_dir.glob("*.tmp"))
    finally:
        client.close()
        for lease_id in list(runtime.list_leases()):
            runtime.stop(lease_id, 0)
