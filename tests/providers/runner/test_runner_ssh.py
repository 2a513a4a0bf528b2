"""SSH access on the runner's side, with the real Docker Engine and a real sshd
(gpumarket/sshd:local) reached by a real client (paramiko) on 127.0.0.1: the lease's
keys land in a per-lease file of the state dir, mounted read-only; only those keys log
in; the file goes with the container and the published port closes. The process
runtime refuses an SSH lease, saying why."""

from __future__ import annotations

import pytest

from providers.runner import ssh_access
from providers.runner.process_runtime import ProcessRuntime
from providers.runner.runtime import DockerRuntime, RuntimeFailure
from tests.support.ssh import key_pair, port_open, ssh_login, ssh_output
from tests.support.waiting import wait_until

from .runner_helpers import lease_for


def _ssh_lease(lease_id: int, image: str, keys: list[str]) -> dict:
    return {**lease_for(lease_id, image, None), "ports": [22], "port_roles": {"22": "ssh"},
            "ssh_authorized_keys": keys}


@pytest.mark.docker
def test_only_the_lease_s_keys_log_in_and_the_port_closes_at_the_end(
        docker_client, docker_node, ssh_image, lease_network, tmp_path):
    buyer, stranger = key_pair(), key_pair("ecdsa-256")
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode=lease_network,
                            simulate=True, public_host="127.0.0.1",
                            keys_dir=tmp_path / "authorized_keys")
    lease = _ssh_lease(71, ssh_image, [buyer.public_line])
    container_id = runtime.start(lease)
    keys_file = tmp_path / "authorized_keys" / "lease-71"
    assert keys_file.read_text() == buyer.public_line + "\n"
    mounts = {m["Destination"]: m for m in
              docker_client.api.inspect_container(container_id)["Mounts"]}
    for point in ssh_access.MOUNT_POINTS:
        assert mounts[point]["Source"] == str(keys_file) and mounts[point]["RW"] is False
    [endpoint] = runtime.endpoints(lease)
    port = endpoint["host_port"]
    assert endpoint == {"container_port": 22, "host": "127.0.0.1", "host_port": port}

    assert wait_until("sshd to answer", lambda: ssh_login(port, buyer), timeout=20) is True
    assert ssh_login(port, stranger) is False
    # read-only from inside: root in the container cannot add a key
    code, _ = docker_client.containers.get(container_id).exec_run(
        ["sh", "-c", "echo x >> /root/.ssh/authorized_keys"])
    assert code != 0

    runtime.stop(71, grace_s=1)
    assert not keys_file.exists()
    assert not port_open(port)
    assert ssh_login(port, buyer) is None


@pytest.mark.docker
def test_an_ssh_session_sees_the_lease_s_env_and_secrets_and_no_log_shows_them(
        docker_client, docker_node, ssh_image, tmp_path):
    secret = "hf_Sessi0nSecret-9c1e"
    buyer = key_pair()
    runtime = DockerRuntime(docker_node, client=docker_client, simulate=True,
                            public_host="127.0.0.1", keys_dir=tmp_path / "authorized_keys")
    lease = {**_ssh_lease(73, ssh_image, [buyer.public_line]), "env": {"MODEL": "llama"},
             "secrets": {"HF_TOKEN": secret}}
    try:
        container_id = runtime.start(lease)
        [endpoint] = runtime.endpoints(lease)
        port = endpoint["host_port"]
        assert wait_until("sshd to answer", lambda: ssh_login(port, buyer), timeout=20)
        out = ssh_output(port, buyer, 'echo "$MODEL $HF_TOKEN $GPUMARKET_LEASE_ID"; '
                                      "stat -c '%a %U' /root/.ssh/environment")
        assert out.splitlines() == [f"llama {secret} 73", "600 root"]
        assert secret not in runtime.logs(73, 500)
        assert secret not in docker_client.containers.get(container_id).logs().decode()
    finally:
        runtime.stop(73, grace_s=0)


def test_a_key_line_that_is_not_one_plain_key_is_refused_before_any_container(tmp_path):
    good = key_pair().public_line
    for bad in ['command="sh" ' + good, good + "\nssh-ed25519 AAAA other", "nonsense"]:
        with pytest.raises(RuntimeFailure, match="not one OpenSSH public key line"):
            ssh_access.write_keys(tmp_path, 5, [good, bad])
    assert not (tmp_path / "lease-5").exists()


def test_the_process_runtime_says_ssh_is_not_offered(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    lease = {**_ssh_lease(9, "ignored", [key_pair().public_line]), "command": ["true"]}
    with pytest.raises(RuntimeFailure, match="SSH access is not offered by the process "
                                              "runtime"):
        runtime.start(lease)
    assert runtime.list_leases() == {}
