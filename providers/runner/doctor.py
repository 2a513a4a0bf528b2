"""`gpumarket-runner doctor`'s checks: NVIDIA driver, MIG devices and NVLinks per GPU
(gpu_text.doctor_lines), Docker Engine, NVIDIA container runtime, isolation between
lease networks (lease_network.isolation_check), marketplace connectivity
and token, clock offset against the marketplace.

Each check gives one PASS/FAIL/SKIP line with the fix for a failure (doctor_checks);
cli.py prints them and exits 1 when one failed. With `--simulate DUMP` the GPU checks read
the recorded dump instead of NVML (the other checks are this host's).
"""

from __future__ import annotations

import time
from datetime import UTC
from email.utils import parsedate_to_datetime

from .catalog import UnknownGpuProduct
from .client import MarketplaceClient, MarketplaceError, Unauthorized
from .gpu_text import doctor_lines
from .lease_network import isolation_check
from .nvml import DumpGpus, NoDriverError, NvmlGpus
from .nvsmi import DumpError
from .runtime import docker_host
from .runtime_common import docker_sdk

CLOCK_MAX_OFFSET_S = 5.0


def _check_line(ok: bool | None, name: str, detail: str, fix: str = "") -> str:
    mark = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
    line = f"{mark}  {name}: {detail}"
    return f"{line} — fix: {fix}" if fix and ok is not True else line


def doctor_checks(url: str | None, token: str | None,
                  simulate: str | None = None) -> list[tuple[bool | None, str]]:
    """Run every check; return (passed: True/False, or None when skipped, line) pairs.
    simulate: a recorded dump (as `--simulate`) read instead of NVML."""
    out: list[tuple[bool | None, str]] = []

    def add(ok, name, detail, fix=""):
        out.append((ok, _check_line(ok, name, detail, fix)))

    driver = f"NVIDIA driver (simulated from {simulate})" if simulate else "NVIDIA driver / NVML"
    try:
        inventory = (DumpGpus(simulate) if simulate else NvmlGpus()).inventory()
        add(True, driver,
            f"driver {inventory.driver_version}, CUDA {inventory.cuda_version}, "
            f"{len(inventory.gpus)} GPU(s)")
        for ok, name, detail, fix in doctor_lines(inventory.gpus):
            add(ok, name, detail, fix)
        for note in inventory.notes:
            add(None, "inventory", note)
    except DumpError as exc:
        add(False, driver, str(exc), "record the dump again (`nvidia-smi -q > FILE`, "
            "`nvidia-smi -L > <base>.L.txt`; docs/RUNNER.md)")
    except (NoDriverError, UnknownGpuProduct) as exc:
        fix = ("install the NVIDIA datacenter driver for this GPU (e.g. `apt install "
               "nvidia-driver-550-server`), reboot or `modprobe nvidia`, and check that "
               "`nvidia-smi` lists the GPUs")
        if isinstance(exc, UnknownGpuProduct):
            fix = ("this GPU model has no marketplace class yet: one file, one test adds it "
                   "(providers/runner/catalog.py; docs/CATALOG.md)")
        add(False, driver, str(exc), fix)

    engine = None
    try:
        engine = docker_sdk().from_env(timeout=10)
        version = engine.version().get("Version", "?")
        add(True, "Docker Engine", f"version {version} at {docker_host()}")
    except Exception as exc:  # DockerException, socket errors
        add(False, "Docker Engine", f"no engine answers at {docker_host()} "
            f"({exc.__class__.__name__})",
            "install Docker Engine (docs.docker.com/engine/install), start it "
            "(`systemctl enable --now docker`) and add this user to the `docker` group")
        engine = None
    runtime_fix = ("install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime "
                   "configure --runtime=docker && sudo systemctl restart docker`")
    if engine is None:
        add(False, "NVIDIA container runtime", "cannot ask: no Docker Engine", runtime_fix)
    else:
        try:
            runtimes = sorted((engine.info().get("Runtimes") or {}).keys())
            if "nvidia" in runtimes:
                add(True, "NVIDIA container runtime", "Docker lists the `nvidia` runtime")
            else:
                add(False, "NVIDIA container runtime",
                    f"Docker's runtimes are {', '.join(runtimes) or 'none'}, no `nvidia`",
                    runtime_fix)
        except Exception as exc:
            add(False, "NVIDIA container runtime", f"`docker info` failed: {exc}", runtime_fix)
        finally:
            engine.close()
        ok, detail, fix = isolation_check()
        add(ok, "lease isolation", detail, fix)

    if not url or not token:
        why = "no marketplace configured (run `gpumarket-runner register` or pass --url/--token)"
        add(None, "marketplace connectivity and token", why)
        add(None, "clock offset", why)
        return out
    client = MarketplaceClient(url, token, timeout=10)
    try:
        before = time.time()
        client.leases()
        after = time.time()
        add(True, "marketplace connectivity and token", f"{url} answers and accepts the token")
    except Unauthorized:
        add(False, "marketplace connectivity and token", f"{url} refused the runner token (401)",
            "re-register the node: its token may have been rotated; take the current one "
            "from the provider portal (or rotate it: POST /api/v1/nodes/<id>/rotate-token/) "
            "and run `gpumarket-runner register --url URL --token NEW_TOKEN`")
        after = time.time()
        before = None
    except MarketplaceError as exc:
        add(False, "marketplace connectivity and token", str(exc),
            "check the URL, DNS, proxy and firewall (outbound HTTPS to the marketplace)")
        before = after = None
    finally:
        client.close()
    date = client.last_date
    if date is None or after is None:
        add(None, "clock offset", "the marketplace gave no Date header to compare with")
        return out
    server = parsedate_to_datetime(date).astimezone(UTC).timestamp()
    local = ((before if before is not None else after) + after) / 2
    offset = server - local
    # The Date header has 1 s resolution: an offset under a second cannot be seen.
    if abs(offset) <= CLOCK_MAX_OFFSET_S:
        add(True, "clock offset", f"{offset:+.1f} s against the marketplace (limit "
            f"±{CLOCK_MAX_OFFSET_S:g} s)")
    else:
        add(False, "clock offset", f"{offset:+.1f} s against the marketplace (limit "
            f"±{CLOCK_MAX_OFFSET_S:g} s)",
            "enable time synchronisation (`timedatectl set-ntp true`, or chrony/ntpd)")
    return out

