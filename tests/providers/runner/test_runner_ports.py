"""Buyer-visible container endpoints on the runner's side: the port bindings a lease's
`ports` turn into and the endpoints read back from the engine's port map (pure
functions), and with the real Docker Engine a container on the host network whose port
is reached over TCP on 127.0.0.1 and reported with `running`.

What cannot run here: publishing through Docker's port bindings needs a bridge network,
and a bridge routes the test's traffic to a private-range container address; tests on
this machine send traffic to 127.0.0.1 only (Docker runs with --bridge=none). The
bindings the runtime asks for are checked as data (port_bindings, endpoints_from_ports)
and on a container created with network "none" (nothing published)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime, endpoints_from_ports, port_bindings

from .runner_helpers import H100, TOKEN, lease_for, wait_for


def test_bindings_publish_each_port_on_the_public_host_at_an_engine_picked_port():
    assert port_bindings([8888, 6006], "127.0.0.1") == {"6006/tcp": ("127.0.0.1", None),
                                                         "8888/tcp": ("127.0.0.1", None)}
    assert port_bindings([8888, 8888], "127.0.0.1") == {"8888/tcp": ("127.0.0.1", None)}
    assert port_bindings([8888], None) is None  # the default: nothing published
    assert port_bindings([], "127.0.0.1") is None
    assert port_bindings(None, "127.0.0.1") is None
    assert port_bindings([8888], "127.0.0.1", "none") is None  # no network: cannot publish
    assert port_bindings([8888], "127.0.0.1", "host") is None  # already on the host


def test_endpoints_are_read_from_the_engine_port_map():
    port_map = {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32768"}],
                "6006/tcp": None, "22/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32769"}]}
    assert endpoints_from_ports(port_map, [8888, 6006], "gpu1.example.net") == [
        {"container_port": 8888, "host": "gpu1.example.net", "host_port": 32768}]
    assert endpoints_from_ports(None, [8888], "h") == []
    assert endpoints_from_ports({"8888/tcp": [{"HostPort": "x"}]}, [8888], "h") == []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def httpd(port: int) -> list[str]:
    """busybox httpd serving one page on 127.0.0.1:`port` only (host network)."""
    return ["sh", "-c", "mkdir -p /w && echo hello-from-lease > /w/index.html && "
            f"exec httpd -f -p 127.0.0.1:{port} -h /w"]


@pytest.mark.docker
def test_a_port_on_the_host_network_is_reachable_and_reported(docker_client, docker_node,
                                                               test_image):
    port = free_port()
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="host",
                            simulate=True, public_host="127.0.0.1")
    lease = {**lease_for(61, test_image, httpd(port)), "ports": [port]}
    container_id = runtime.start(lease)
    try:
        attrs = docker_client.api.inspect_container(container_id)
        assert not attrs["HostConfig"].get("PortBindings")  # nothing to publish
        assert runtime.endpoints(lease) == [
            {"container_port": port, "host": "127.0.0.1", "host_port": port}]

        def fetch():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    return r.read().decode()
            except OSError:
                return None

        assert wait_for(fetch, timeout=10) == "hello-from-lease\n"
    finally:
        runtime.stop(61, grace_s=1)


@pytest.mark.docker
def test_without_a_public_host_or_with_network_none_nothing_is_published(
        docker_client, docker_node, test_image):
    lease = {**lease_for(62, test_image, ["sleep", "30"]), "ports": [8080]}
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True, public_host="127.0.0.1")
    container_id = runtime.start(lease)
    assert not docker_client.api.inspect_container(container_id)["HostConfig"].get(
        "PortBindings")
    assert runtime.endpoints(lease) == []
    runtime.stop(62, grace_s=1)
    quiet = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                          simulate=True)
    assert quiet.endpoints(lease) == []


@pytest.mark.docker
def test_the_agent_reports_the_endpoints_with_running(marketplace, docker_client, docker_node,
                                                      test_image):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    port = free_port()
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="host",
                            simulate=True, public_host="127.0.0.1",
                            advertise_host="gpu-host-1.example.net")
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  log=lambda _m: None)
    try:
        agent.announce()
        lease = lease_for(63, test_image, httpd(port))
        marketplace.add_lease(63, lease["gpu_uuids"], image=test_image, command=httpd(port),
                              ports=[port])
        marketplace.add_lease(64, lease["gpu_uuids"][:1], image=test_image,
                              command=["sleep", "30"])  # exposes nothing
        agent.tick()
        running = [e for e in marketplace.events_for(63) if e["status"] == "running"]
        assert running[0]["endpoints"] == [
            {"container_port": port, "host": "gpu-host-1.example.net", "host_port": port}]
        [plain] = [e for e in marketplace.events_for(64) if e["status"] == "running"]
        assert "endpoints" not in plain
    finally:
        for lease_id in (63, 64):
            runtime.stop(lease_id, grace_s=1)
        client.close()


def test_run_refuses_an_unreachable_advertised_host(tmp_path):
    from .test_runner_cli import runner

    done = runner("run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "--state-dir",
                  str(tmp_path), "--public-host", "0.0.0.0")
    assert done.returncode == 1
    assert "--public-host 0.0.0.0 binds every interface: also pass --advertise-host" \
        in done.stderr
    done = runner("run", "--url", "http://127.0.0.1:9", "--token", TOKEN, "--state-dir",
                  str(tmp_path), "--advertise-host", "gpu1.example.net")
    assert done.returncode == 1 and "--advertise-host needs --public-host" in done.stderr
