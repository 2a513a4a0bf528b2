"""Lease isolation with the real Docker Engine (dockerd here: --bridge=none
--iptables=false, net.ipv4.ip_forward=1): each lease gets a bridge network of its own
(ICC off, interface gm…), its ports still published on 127.0.0.1, the network removed with
the lease. Whether lease A reaches lease B's address is the host's routing: doctor's check
says so, and the provider's fix of docs/RUNNER.md (the FORWARD drop rule) makes A unable
to reach B. docs/RUNNER.md, "Lease isolation"."""

from __future__ import annotations

import shutil
import subprocess

import docker
import pytest

from providers.runner import lease_network
from providers.runner.runtime import DockerRuntime
from tests.conftest import require_or_skip
from tests.support.ssh import port_open
from tests.support.waiting import wait_until

from .runner_helpers import lease_for

SERVE = ["sh", "-c", "while true; do echo banner-$GPUMARKET_LEASE_ID | nc -l -p 22; done"]
PROBE = "echo | timeout 3 nc {ip} 22"


def _address(client, container_id: str) -> tuple[str, str]:
    networks = client.api.inspect_container(container_id)["NetworkSettings"]["Networks"]
    [(name, net)] = networks.items()
    return name, net["IPAddress"]


def _reaches(client, container_id: str, ip: str) -> str:
    _, out = client.containers.get(container_id).exec_run(
        ["sh", "-c", PROBE.format(ip=ip)])
    return out.decode()


def _iptables(*args: str) -> int:
    return subprocess.run(["iptables", *args], capture_output=True, timeout=10).returncode


@pytest.mark.docker
def test_each_lease_has_its_own_network_and_cannot_reach_another(
        docker_client, docker_node, test_image):
    runtime = DockerRuntime(docker_node, client=docker_client, simulate=True,
                            public_host="127.0.0.1")
    assert runtime.network_mode == lease_network.PER_LEASE  # the default
    a = {**lease_for(81, test_image, SERVE), "ports": [22]}
    b = {**lease_for(82, test_image, SERVE), "ports": [22]}
    rule_added = False
    try:
        ida, idb = runtime.start(a), runtime.start(b)
        (net_a, ip_a), (net_b, ip_b) = _address(docker_client, ida), _address(docker_client, idb)
        assert net_a != net_b
        for name in (net_a, net_b):
            attrs = docker_client.networks.get(name).attrs
            assert attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"
            assert attrs["Options"]["com.docker.network.bridge.name"].startswith("gm")
            assert len(attrs["Containers"]) == 1  # the lease alone
        # still published for the buyer, on the public host
        [ep_b] = runtime.endpoints(b)
        assert wait_until("lease 82's port", lambda: port_open(ep_b["host_port"]), timeout=10)
        assert wait_until("lease 82 to serve on its own network",
                          lambda: "banner-82" in _reaches(docker_client, idb, ip_b), timeout=10)

        ok, detail, fix = lease_network.isolation_check()
        routed = "banner-82" in _reaches(docker_client, ida, ip_b)
        assert ok is (not routed), (detail, routed)  # doctor tells the truth about this host
        if routed:  # --iptables=false, ip_forward=1: apply the fix docs/RUNNER.md gives
            assert "ip_forward=1" in detail and "iptables -I FORWARD" in fix
            if shutil.which("iptables") is None or _iptables("-S", "FORWARD") != 0:
                require_or_skip("iptables cannot be changed here (not root, or no iptables)")
            assert _iptables("-I", *lease_network.DROP_RULE) == 0
            rule_added = True
            assert lease_network.isolation_check()[0] is True
        assert "banner-82" not in _reaches(docker_client, ida, ip_b)
        assert "banner-81" not in _reaches(docker_client, idb, ip_a)
        assert "banner-82" in _reaches(docker_client, idb, ip_b)  # B itself still serves
    finally:
        if rule_added:
            _iptables("-D", *lease_network.DROP_RULE)
        runtime.stop(81, grace_s=0)
        runtime.stop(82, grace_s=0)
    for name in (net_a, net_b):
        with pytest.raises(docker.errors.NotFound):
            docker_client.networks.get(name)
    assert not port_open(ep_b["host_port"])


def test_doctor_s_isolation_check_names_each_host_setting():
    assert lease_network.isolation_check(iptables=True)[0] is True
    assert lease_network.isolation_check(iptables=False, forward=False)[0] is True
    assert lease_network.isolation_check(iptables=False, forward=True, drop_rule=True)[0]
    ok, detail, fix = lease_network.isolation_check(iptables=False, forward=True,
                                                    drop_rule=False)
    assert ok is False and "--iptables=false" in detail
    assert "iptables -I FORWARD -i gm+ -o gm+ -j DROP" in fix


def test_dockerd_s_iptables_setting_is_read_from_its_command_line(tmp_path):
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    none = tmp_path / "absent.json"
    assert lease_network._dockerd_iptables(proc, none) is None  # no dockerd here
    (proc / "7" / "cmdline").write_bytes(b"/usr/bin/dockerd\0--bridge=none\0")
    assert lease_network._dockerd_iptables(proc, none) is True
    (proc / "7" / "cmdline").write_bytes(b"dockerd\0--iptables=false\0")
    assert lease_network._dockerd_iptables(proc, none) is False
    (proc / "7" / "cmdline").write_bytes(b"dockerd\0")
    conf = tmp_path / "daemon.json"
    conf.write_text('{"iptables": false}')
    assert lease_network._dockerd_iptables(proc, conf) is False
