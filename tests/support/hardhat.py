"""A Hardhat 2 node on 127.0.0.1 for tests that need a real JSON-RPC chain shared by
several processes (contracts/node_modules/hardhat, started with `node`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from web3 import HTTPProvider, Web3

from tests.conftest import ROOT, require_or_skip
from tests.support.net import free_port

CONTRACTS = ROOT / "contracts"


@contextlib.contextmanager
def hardhat_node() -> Iterator[tuple[Web3, str]]:
    """Yield (web3, rpc url) of a fresh Hardhat node; skip (or fail under
    GPUMARKET_REQUIRE_ALL=1) when Node or the npm toolchain is missing."""
    node = shutil.which("node")
    if node is None:
        require_or_skip("node is not installed: cannot start a Hardhat node")
    cli = CONTRACTS / "node_modules" / "hardhat" / "internal" / "cli" / "cli.js"
    if not cli.exists():
        require_or_skip("contracts/node_modules missing: run `npm ci --prefix contracts`")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true", "CI": "true"}
    proc = subprocess.Popen(
        [node, str(cli), "node", "--hostname", "127.0.0.1", "--port", str(port)],
        cwd=CONTRACTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        w3 = Web3(HTTPProvider(url, request_kwargs={"timeout": 30}))
        deadline = time.monotonic() + 60
        while not w3.is_connected():
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"hardhat node exited with {proc.returncode}:\n{out[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("hardhat node did not answer within 60 s")
            time.sleep(0.25)
        yield w3, url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
