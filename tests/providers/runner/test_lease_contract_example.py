"""docs/LEASE_CONTRACT.md's example handler, run as it stands: a lease workload of the
process runtime (the system's python3) that gets the notice and SIGUSR1 from the real
agent, checkpoints, exits 0 — and its next run resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import ProcessRuntime

from .runner_helpers import A10, ROOT, TOKEN, iso, wait_for

PYTHON = "/usr/bin/python3"  # the lease's user may not reach the project's venv


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
            log = Path(runtime._load()[lease_id]["log"])
            assert runtime.exit_status(lease_id) is None
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
