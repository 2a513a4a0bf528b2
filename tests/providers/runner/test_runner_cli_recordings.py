"""`gpumarket-runner inventory`, `doctor` and `register` with `--simulate` of the recorded
hosts (data/nvidia-smi/), as real subprocesses: every recording prints its real model names
and slices; the MIG host passes doctor's MIG check; a dump whose MIG sections contradict
each other is refused by `register` before anything reaches the marketplace."""

from __future__ import annotations

import pytest

from tests.support.mig_host import A100_MIG, with_a100_listing

from .runner_helpers import DUMPS, TOKEN
from .test_runner_cli import runner
from .test_runner_recordings import H100_MIG, H200_MIG, RECORDINGS

MIG_LISTED = {"h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt": H100_MIG,
              "h200-mig-x1.utku-exporter-590.48.01.q-idle.txt": H200_MIG}
H100_MIG_Q = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.q-idle.txt"


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_inventory_of_every_recording_prints_its_real_names_and_slices(name):
    count, product, *_ = RECORDINGS[name]
    done = runner("inventory", "--simulate", str(DUMPS / name))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{count} \u00d7 {product} (")
    assert lines[0].endswith(f"(source: simulate:{name})")
    gpu_lines = [line for line in lines if line.startswith("  GPU ")]
    assert len(gpu_lines) == count
    assert all(f"  {product}  " in line for line in gpu_lines)
    mig_lines = [line.split() for line in lines if line.startswith("      MIG ")]
    expected = MIG_LISTED.get(name, [])
    # a compute instance that is part of its GPU instance prints its own profile
    split = {"MIG-00000000-0000-0000-0000-000000000000": "1c.3g.71gb",
             "MIG-00000001-0000-0000-0000-000000000001": "2c.3g.71gb"} if expected is H200_MIG \
        else {}
    assert [(m[2], m[3]) for m in mig_lines] == [(uuid, split.get(uuid, profile))
                                                 for uuid, profile, *_ in expected]


def test_inventory_of_the_a100_mig_xml_with_a_listing_prints_its_slices(tmp_path):
    done = runner("inventory", "--simulate", str(with_a100_listing(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "MIG Enabled: 4 \u00d7 1g.20gb" in done.stdout
    for device in A100_MIG.gpus[0].mig_devices:
        assert f"{device.uuid}  1g.20gb  GI {device.gpu_instance_id} CI 0  19968 MiB  14 SMs" \
            in done.stdout
    assert "left out" not in done.stdout


def _doctor(dump, tmp_path) -> list[str]:
    done = runner("doctor", "--simulate", str(dump), "--state-dir", str(tmp_path / "state"))
    assert "Traceback" not in done.stderr
    return done.stdout.splitlines()


def test_doctor_simulating_the_mig_host_passes_its_mig_check(tmp_path):
    lines = _doctor(H100_MIG_Q, tmp_path)
    assert lines[0].startswith(f"PASS  NVIDIA driver (simulated from {H100_MIG_Q}): "
                               "driver 590.48.01, CUDA 13.1, 1 GPU(s)")
    assert "PASS  MIG: GPU 0 NVIDIA H100 80GB HBM3 MIG Enabled: 1 \u00d7 3g.40gb, " \
           "1 \u00d7 2g.20gb, 2 \u00d7 1g.10gb" in lines
    # the A100 report alone names no MIG device: the check fails and says what to do
    lines = _doctor(DUMPS / "a100-sxm4-80gb-mig-x1of4.telegraf.xml", tmp_path)
    [mig] = [line for line in lines if "  MIG: " in line]
    assert mig.startswith("FAIL  MIG: GPU 0 NVIDIA A100-SXM4-80GB MIG Enabled: no MIG "
                          "devices listed — fix: ")
    lines = _doctor(with_a100_listing(tmp_path), tmp_path)
    assert "PASS  MIG: GPU 0 NVIDIA A100-SXM4-80GB MIG Enabled: 4 \u00d7 1g.20gb" in lines


def test_doctor_simulating_a_malformed_dump_fails_its_gpu_check_naming_the_line(tmp_path):
    lines = _doctor(DUMPS / "h100-80gb-hbm3-x8.truncated.txt", tmp_path)
    assert lines[0].startswith("FAIL  NVIDIA driver (simulated from ")
    assert "h100-80gb-hbm3-x8.truncated.txt:86: corrupted lines 86-88" in lines[0]
    assert lines[-1].endswith("check(s) failed")


def test_register_refuses_a_self_contradicting_mig_dump_and_sends_nothing(marketplace,
                                                                        tmp_path):
    listing = (DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.L.txt").read_text()
    (tmp_path / "host.q.txt").write_bytes(H100_MIG_Q.read_bytes())
    (tmp_path / "host.L.txt").write_text(listing.replace(  # one MIG UUID given twice
        "MIG-00000003-0000-0000-0000-000000000003", "MIG-00000002-0000-0000-0000-000000000002"))
    state = tmp_path / "state"
    done = runner("register", "--url", marketplace.url, "--simulate",
                  str(tmp_path / "host.q.txt"), "--state-dir", str(state),
                  env={"GPUMARKET_RUNNER_TOKEN": TOKEN})
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("gpumarket-runner: malformed nvidia-smi dump: host.L.txt:5: ")
    assert "MIG UUID MIG-00000002-0000-0000-0000-000000000002 is given to two MIG devices" \
        in line
    assert done.stdout == ""
    assert marketplace.inventories == []  # nothing reached the marketplace
    assert not (state / "config.json").exists()
