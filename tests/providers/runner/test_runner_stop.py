"""Stopping `gpumarket-runner run` (SIGTERM as systemd does, SIGINT as Ctrl-C does) in any
state, and an unreachable marketplace at startup: the runner says so once and keeps trying;
a stop signal always exits 0 with a clear line and never touches a lease workload.

The runner is a real subprocess (`python -m providers.runner run`) with simulated GPUs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import ProcessRuntime

from .runner_helpers import A10, ROOT, TOKEN, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    """`gpumarket-runner run` in its own process; its output in a file, read at any time."""

    def __init__(self, tmp_path, url: str, *extra: str) -> None:
        self.out = tmp_path / "runner.out"
        self.err = tmp_path / "runner.err"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
        clean["GPUMARKET_RUNNER_TOKEN"] = TOKEN  # not --token: `ps` shows it to everyone
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "providers.runner", "run", "--url", url,
                 "--simulate", str(A10), "--state-dir", str(tmp_path / "state"),
                 *extra], cwd=ROOT, stdout=out, stderr=err, env=clean)

    def output(self) -> str:
        return self.out.read_text()

    def wait_for_line(self, text: str, timeout: float = 30) -> None:
        wait_for(lambda: text in self.output() or self.proc.poll() is not None, timeout)
        assert text in self.output(), self.output() + self.err.read_text()

    def stop(self) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return code, self.output(), self.err.read_text()


@pytest.mark.parametrize("runtime", ["docker", "process"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_before_the_marketplace_answers_exits_0(request, tmp_path, runtime,
                                                              signum):
    """The trial's case: nothing answers at --url, the node is not registered (no node id
    to label Docker containers with yet). SIGTERM printed "DockerRuntime.node is not set"
    and exited 1; now SIGTERM and SIGINT both stop cleanly, whatever the runtime."""
    if runtime == "docker":
        request.getfixturevalue("docker_client")  # skips (or fails in CI) without an engine
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    runner = Runner(tmp_path, url, "--runtime", runtime)
    try:
        runner.wait_for_line("does not answer")
        time.sleep(0.5)
        runner.proc.send_signal(signum)
        code, out, err = runner.stop()
    finally:
        if runner.proc.poll() is None:
            runner.proc.kill()
    assert code == 0, out + err
    assert err == ""
    name = signal.Signals(signum).name
    assert f"received {name}: stopping" in out
    assert "lease workloads keep running" in out
    assert out.rstrip().endswith("stopped before the marketplace answered; no lease workload "
                                 "was started or touched"), out
    # unreachable at startup: said once, clearly, with the promise to keep trying
    [line] = [ln for ln in out.splitlines() if "does not answer" in ln]
    assert f"the marketplace at {url} does not answer" in line
    assert "retrying every 2 s, backing off to 30 s, until it answers" in line


def test_a_second_signal_exits_at_once_even_inside_a_slow_call(tmp_path):
    """A marketplace that accepts the connection and never answers: the inventory call
    hangs (10 s timeout). The first SIGTERM lets the current step finish; a second one
    leaves it at once, still with status 0 and a line saying so."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the kernel completes the handshake, nobody reads
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        runner = Runner(tmp_path, url, "--runtime", "process")
        try:
            runner.wait_for_line("gpumarket-runner 0.")
            time.sleep(1.0)  # inside POST /inventory/ now
            runner.proc.send_signal(signal.SIGTERM)
            runner.wait_for_line("received SIGTERM: stopping (after the current step")
            assert runner.proc.poll() is None  # still in the hanging call
            sent = time.monotonic()
            runner.proc.send_signal(signal.SIGTERM)
            code, out, err = runner.stop()
            took = time.monotonic() - sent
        finally:
            if runner.proc.poll() is None:
                runner.proc.kill()
    assert code == 0, out + err
    assert took < 3, f"{took:.1f} s after the second SIGTERM"
    assert "received SIGTERM again: exiting now; lease workloads keep running" in out
    assert err == ""


def test_sigterm_leaves_a_running_process_lease_alone(marketplace, tmp_path):
    """Once leases run, SIGTERM still stops only the runner: the lease's process goes on
    and the last line counts it (the rule that stays)."""
    marketplace.add_lease(31, [], image="ignored", command=["sleep", "30"])
    runner = Runner(tmp_path, marketplace.url, "--runtime", "process", "--poll-interval",
                    "0.2")
    pid = None
    try:
        wait_for(lambda: len(marketplace.events_for(31)) >= 2, timeout=30)
        pid = int(marketplace.events_for(31)[1]["container_id"].removeprefix("pid-"))
        runner.proc.send_signal(signal.SIGTERM)
        code, out, err = runner.stop()
        assert code == 0, out + err
        os.kill(pid, 0)  # still alive
        assert out.rstrip().endswith("stopped; 1 lease workload(s) left running for "
                                     "re-adoption"), out
    finally:
        if runner.proc.poll() is None:
            runner.proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        ProcessRuntime(tmp_path / "state").stop(31, grace_s=0)  # its user's, its directory


def test_startup_outage_is_logged_once_then_the_answer(marketplace, tmp_path):
    """503 at startup (a deploy): one line saying the runner keeps trying, nothing per
    retry while the reason stays the same, then the inventory line says how long it took."""
    marketplace.outage = True
    lines: list[str] = []
    client = MarketplaceClient(marketplace.url, TOKEN)
    agent = Agent(client, DumpGpus(A10), ProcessRuntime(tmp_path), poll_interval=0.05,
                  log=lines.append)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    loop.start()
    try:
        time.sleep(1.0)  # 0.05, 0.1, 0.2, 0.4 s: several retries
        marketplace.outage = False
        wait_for(lambda: any("inventory sent" in ln for ln in lines), timeout=10)
    finally:
        stop.set()
        loop.join(10)
        client.close()
    outage = [ln for ln in lines if "503" in ln]
    assert len(outage) == 1, lines
    assert "retrying every 0.05 s, backing off to 30 s, until it answers" in outage[0]
    [sent] = [ln for ln in lines if "inventory sent" in ln]
    assert "(the marketplace answered after " in sent
