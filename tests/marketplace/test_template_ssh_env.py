"""The SSH templates' own commands hand the container's environment (the lease's env and
secrets) to SSH sessions: each template's command runs in the real sshd image (its
`command -v sshd` finds one, so nothing is installed; Jupyter's part is left out; the image's own
PermitUserEnvironment line removed first, so only the template's `-o` can allow it),
and a real client (paramiko) reads the variables in a session. The template images
themselves (Docker Hub) cannot be pulled here."""

from __future__ import annotations

import uuid

import pytest

from marketplace.env_templates import get_template
from providers.runner import ssh_access
from tests.support.ssh import key_pair, ssh_login, ssh_output
from tests.support.waiting import wait_until

PRELUDE = ("ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && "
           "sed -i '/PermitUserEnvironment/d' /etc/ssh/sshd_config && ")


@pytest.mark.docker
@pytest.mark.parametrize("template_id", ["cuda-ssh", "pytorch-jupyter"])
def test_an_ssh_template_s_session_sees_the_env_and_secrets(
        docker_client, ssh_image, lease_network, tmp_path, template_id):
    shell, flag, script = get_template(template_id).command
    # pytorch-jupyter's sshd runs in the background, then Jupyter (no pip here): keep the
    # sshd part and stay up instead
    jupyter = "; (command -v jupyter-lab"
    script = script.split(jupyter)[0] + ("; exec sleep 600" if jupyter in script else "")
    buyer = key_pair()
    keys = ssh_access.write_keys(tmp_path, 1, [buyer.public_line])
    secret = f"hf_{uuid.uuid4().hex}"
    container = docker_client.containers.run(
        ssh_image, entrypoint=[shell, flag, PRELUDE + script], detach=True,
        environment={"MODEL": "llama", "HF_TOKEN": secret}, network=lease_network,
        ports={"22/tcp": ("127.0.0.1", None)}, volumes=ssh_access.volumes(keys),
        labels={"gpumarket.test": "template-ssh-env"})
    try:
        container.reload()
        port = int(container.attrs["NetworkSettings"]["Ports"]["22/tcp"][0]["HostPort"])
        assert wait_until("the template's sshd", lambda: ssh_login(port, buyer), timeout=20)
        out = ssh_output(port, buyer, 'echo "$MODEL $HF_TOKEN"; '
                                      "stat -c '%a %U' /root/.ssh/environment")
        assert out.splitlines() == [f"llama {secret}", "600 root"]
        assert secret not in container.logs().decode()
    finally:
        container.remove(force=True)
