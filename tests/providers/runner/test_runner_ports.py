"""Buyer-visible container endpoints on the runner's side: the port bindings a lease's
`ports` turn into (pure functions), and with the real Docker Engine a container whose port
is published on 127.0.0.1 (never 0.0.0.0 in tests) of a user-defined bridge network,
reached over TCP, and reported with `running`.

Docker here has no default `bridge` network (only `host` and `none`), and `--network none`
cannot publish ports; a user-defined bridge network, created by the test, can. That is
what a provider runs with `--network NAME --public-host ADDR`."""

from __future__ import annotations

import random
import urllib.request

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime, endpoints_from_ports, port_bindings

from .runner_helpers import H100, TOKEN, lease_for, wait_for

HTTPD = ["sh", "-c", "mkdir -p /w && echo hello-from-lease > /w/index.html && "
         "exec httpd -f -p 8080 -h /w"]


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


@pytest.fixture
def bridge(docker_client):
    """A user-defined bridge network for this test (removed afterwards)."""
    name = f"gmtest-{random.randint(10**6, 10**7)}"
    try:
        network = docker_client.networks.create(name, driver="bridge")
    except Exception as exc:  # an engine without bridge networking
        pytest.skip(f"Docker cannot create a bridge network here: {exc}")
    yield name
    for container in docker_client.containers.list(all=True, filters={"network": name}):
        container.remove(force=True)
    network.remove()


@pytest.mark.docker
def test_a_published_port_is_reachable_and_reported(docker_client, docker_node, bridge,
                                                    test_image):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode=bridge,
                            simulate=True, public_host="127.0.0.1")
    lease = {**lease_for(61, test_image, HTTPD), "ports": [8080]}
    container_id = runtime.start(lease)
    attrs = docker_client.api.inspect_container(container_id)
    assert attrs["HostConfig"]["PortBindings"] == {
        "8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    [endpoint] = runtime.endpoints(lease)
    assert endpoint["container_port"] == 8080 and endpoint["host"] == "127.0.0.1"
    assert endpoint["host_port"] > 0

    def fetch():
        url = f"http://127.0.0.1:{endpoint['host_port']}/"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.read().decode()
        except OSError:
            return None

    assert wait_for(fetch, timeout=10) == "hello-from-lease\n"
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
                                                      bridge, test_image):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode=bridge,
                            simulate=True, public_host="127.0.0.1",
                            advertise_host="gpu-host-1.example.net")
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  log=lambda _m: None)
    try:
        agent.announce()
        lease = lease_for(63, test_image, HTTPD)
        marketplace.add_lease(63, lease["gpu_uuids"], image=test_image, command=HTTPD,
                              ports=[8080])
        marketplace.add_lease(64, lease["gpu_uuids"][:1], image=test_image,
                              command=["sleep", "30"])  # exposes nothing
        agent.tick()
        running = [e for e in marketplace.events_for(63) if e["status"] == "running"]
        [endpoint] = running[0]["endpoints"]
        assert endpoint["container_port"] == 8080
        assert endpoint["host"] == "gpu-host-1.example.net"
        bound = docker_client.api.inspect_container(running[0]["container_id"])
        published = bound["NetworkSettings"]["Ports"]["8080/tcp"][0]
        assert published["HostIp"] == "127.0.0.1"
        assert int(published["HostPort"]) == endpoint["host_port"]
        [plain] = [e for e in marketplace.events_for(64) if e["status"] == "running"]
        assert "endpoints" not in plain
    finally:
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
