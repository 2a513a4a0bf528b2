"""Hosts of a test's own making: network namespaces (`ip netns`) on one bridge of the
root namespace, each with a veth and an address in 10.213.<subnet>.0/24 (the bridge has
.1, the hosts .2, .3, …). Nothing else is routed: the hosts reach each other over the
bridge and the root namespace's services only through `expose()`, a socat proxy bound on
the bridge address (PostgreSQL and Redis keep listening on 127.0.0.1 only). Needs root
and iproute2 and socat; `close()` removes all it made (processes, proxies, links)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import require_or_skip
from tests.support.net import free_port
from tests.support.waiting import wait_until


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


class Hosts:
    """`Hosts(["web-a", "web-b", "runners"])` → `.address[name]`, `.run(name, argv, …)`
    (a Popen inside that host), `.expose(port)` → the bridge port that reaches
    127.0.0.1:port; `.gateway` is the bridge address."""

    def __init__(self, names: list[str], subnet: int = 13) -> None:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("socat"):
            require_or_skip("network-namespace hosts need root, iproute2 and socat")
        tag = f"gm{os.getpid() % 100000}"
        self.bridge, self.gateway = f"{tag}br", f"10.213.{subnet}.1"
        self.namespaces = {name: f"{tag}-{name}" for name in names}
        self.address = {name: f"10.213.{subnet}.{i + 2}" for i, name in enumerate(names)}
        self._links: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (name, ns) in enumerate(self.namespaces.items()):
                _ip("netns", "add", ns)
                outer, inner = f"{tag}v{i}o", f"{tag}v{i}i"
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                self._links.append(outer)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def run(self, name: str, argv: list[str], *, env: dict, log: Path,
            cwd: Path | None = None) -> subprocess.Popen:
        out = open(log, "w")  # noqa: SIM115 (closed in close())
        self._logs.append(out)
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespaces[name], *argv],
                                env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        self._procs.append(proc)
        return proc

    def expose(self, port: int) -> int:
        """A proxy on the bridge address (root namespace) to 127.0.0.1:`port`."""
        outer = free_port()
        proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{outer},bind={self.gateway},fork,reuseaddr",
             f"TCP:127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._procs.append(proc)
        import socket

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex((self.gateway, outer)) == 0
        wait_until(f"socat on {self.gateway}:{outer}", listening, timeout=10, every=0.05)
        return outer

    def close(self) -> None:
        """Idempotent: stops every process, then removes the namespaces and links."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in self._logs:
            out.close()
        for ns in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        self._procs, self._logs, self._links, self.namespaces = [], [], [], {}

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
