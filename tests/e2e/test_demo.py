"""The README's demo command, played to the end (DEMO_ONESHOT=1), with its own
SQLite file, filesystem Celery broker and port, as a new user would run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT
from tests.support.net import free_port

pytestmark = pytest.mark.e2e


def test_make_demo_oneshot_reports_the_whole_flow(tmp_path):
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(DEMO_ONESHOT="1", DEMO_PORT=str(free_port()), GPUMARKET_VAR_DIR=str(tmp_path))
    done = subprocess.run(["make", "demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    for step in ("provider ", "gpus registered", "ask ", "bid ", "fill ", "auction closed",
                 "lease started", "lease ended", "gpu health", "ledger split", "ledger check",
                 "done"):
        assert f"[demo] {step}" in out, f"missing step {step!r} in:\n{out}"
    assert "8 × NVIDIA H100 80GB HBM3 (h100-sxm-80gb)" in out
    assert "8 × NVIDIA GeForce RTX 4090 (rtx-4090)" in out
    assert "winner bob, clearing price 1.300000" in out
    # The processes the recorded hosts ran (every RTX 4090, the third H100) are a baseline
    # the runner leaves alone: a warning each, never a failed GPU after the leases.
    assert re.search(r"gpu health +h100-node-1: 8 of 8 GPUs healthy; warnings: "
                     r"hw_power_brake ×1, process_foreign ×1\n", out), out
    assert re.search(r"gpu health +rtx4090-node-1: 8 of 8 GPUs healthy; warnings: "
                     r"process_foreign ×8\n", out), out
    assert "unhealthy" not in out
    # a container id where Docker answers; else the process runtime's handle (pid-N), which
    # the demo chose explicitly (`--runtime auto` never picks it)
    if "Docker Engine answers: leases run as containers" in out:
        handle = r"container [0-9a-f]{12}"
    else:
        assert "the runners are started with --runtime process" in out, out
        handle = r"process pid-\d+"
    assert re.search(rf"lease started +lease \d+: 2 × h100-sxm-80gb in {handle}\n", out), out
    # every settled lease: provider + platform = cost, platform = cost × 15 % floored
    splits = re.findall(r"cost (\d+\.\d{6}) USD = provider (\d+\.\d{6}) \(85 %\) \+ platform "
                        r"(\d+\.\d{6})", out)
    assert len(splits) == 2
    for cost, provider, platform in splits:
        c, p, f = (int(x.replace(".", "")) for x in (cost, provider, platform))
        assert p + f == c and f == c * 1500 // 10_000
    assert "ledger is consistent" in out
