"""scripts/gpu-check.sh on this host, which has no GPU: `nvidia-smi` is a stub that prints
the recorded H100 MIG host and logs its arguments (the one thing that cannot run here).
The script's own logic runs for real: recording, the runner on the recording, the
summary, and the MIG layout made and removed, never a reset or a MIG mode change."""

from __future__ import annotations

import os
import subprocess
import sys

from .runner_helpers import DUMPS, ROOT

STUB = """#!/bin/sh
echo "$*" >> "{calls}"
case "$*" in
  "-q") cat "{q}" ;;
  "-L") cat "{listing}" ;;
  "-q -i 0") cat "{q}" ;;
  "nvlink -s") ;;
  *mig.mode.current*) echo Enabled ;;
  "mig -i 0 -lgi") echo "No GPU instances found: Not Found" ;;
  "-q -x") exit 6 ;;
  *) echo "stub: $*" ;;
esac
"""


def _run(tmp_path, **env):
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    stub = bin_dir / "nvidia-smi"
    stub.write_text(STUB.format(
        calls=calls, q=DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt",
        listing=DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.L.txt"))
    stub.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")], cwd=tmp_path, capture_output=True,
        text=True, timeout=240,
        env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
             "GPU_CHECK_PYTHON": sys.executable, **env})
    summary = done.stdout.split("== summary", 1)[1].splitlines()
    return done, summary, calls.read_text().splitlines(), out


def test_records_the_host_and_reads_the_recording_back(tmp_path):
    done, summary, calls, out = _run(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "PASS  nvidia-smi -q: host.q.txt, 341 lines" in summary
    assert "FAIL  nvidia-smi -q -x: exit 6" in summary and not (out / "host.q.xml").exists()
    assert any(line.startswith("PASS  inventory --simulate host.q.txt") for line in summary)
    assert any(line.startswith("FAIL  inventory (NVML): exit 2") for line in summary)
    assert "SKIP  MIG layout: not asked (GPU_CHECK_MIG_LAYOUT=1); MIG mode Enabled" in summary
    log = (out / "gpu-check.log").read_text()
    assert "MIG 3  MIG-00000003-0000-0000-0000-000000000003  1g.10gb" in log  # host.L.txt used
    assert not [c for c in calls if "mig -" in c or c.startswith("-r")]
    assert len(list(out.iterdir())) <= 8  # what a lent machine sends back


def test_mig_layout_is_made_and_removed_but_the_mode_never_changed(tmp_path):
    done, summary, calls, out = _run(tmp_path, GPU_CHECK_MIG_LAYOUT="1",
                                     GPU_CHECK_MIG_PROFILES="1g.10gb,1g.10gb")
    assert done.returncode == 0, done.stdout
    mig_calls = [c for c in calls if c.startswith("mig ")]
    assert mig_calls == ["mig -i 0 -lgi", "mig -i 0 -lgip", "mig -i 0 -cgi 1g.10gb,1g.10gb -C",
                         "mig -i 0 -dci", "mig -i 0 -dgi"]
    assert not [c for c in calls if " -mig " in f" {c} " or c.startswith(("-r", "--gpu-reset"))]
    assert (out / "mig.L.txt").exists() and (out / "mig.q.txt").exists()
    assert any(line.startswith("PASS  inventory --simulate mig.q.txt") for line in summary)
    assert len(list(out.iterdir())) <= 8
