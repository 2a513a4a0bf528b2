"""A lease's secrets on the runner: parsed from the lease list (never in a repr), merged
with its env into the workload's environment (the runner's own names win), and redacted
from the log tails the runner posts — with the real Docker Engine, real local processes
and the stand-in marketplace (which does not redact: what it receives is what the runner
sent)."""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.lease import RunnerLease
from providers.runner.logtail import REDACTED, lease_tail, redact
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime, ProcessRuntime
from providers.runner.runtime_common import lease_env

from .runner_helpers import A10, H100, TOKEN, FakeMarketplace, lease_for, wait_for
from .runner_helpers import LEASE_UUIDS as UUIDS

SECRET = "s3cr3t-Runner-Value-7f2a"


def _lease(lease_id: int, command: list[str], image: str = "ignored", **extra) -> dict:
    return {**lease_for(lease_id, image, command), "secrets": {"MY_TOKEN": SECRET},
            "env": {"GPUMARKET_LEASE_ID": str(lease_id), "MODE": "train"}, **extra}


def test_the_lease_list_item_carries_secrets_that_no_repr_shows():
    parsed = RunnerLease.parse(_lease(7, ["true"], port_roles={"8888": "jupyter"}))
    assert parsed.secrets == {"MY_TOKEN": SECRET}
    assert parsed.port_roles == {"8888": "jupyter"}
    assert SECRET not in repr(parsed) and SECRET not in str(parsed)
    assert RunnerLease.parse({"id": 8}).secrets == {}  # an older marketplace sends none


def test_the_workload_env_is_env_and_secrets_and_the_runners_names_win():
    item = _lease(9, ["true"], secrets={"MY_TOKEN": SECRET, "GPUMARKET_LEASE_ID": "1",
                                        "NVIDIA_VISIBLE_DEVICES": "all"},
                  env={"MODE": "train", "GPUMARKET_LEASE_ID": "2"})
    env = lease_env(RunnerLease.parse(item))
    assert env == {"MODE": "train", "MY_TOKEN": SECRET, "GPUMARKET_LEASE_ID": "9",
                   "NVIDIA_VISIBLE_DEVICES": ",".join(UUIDS)}


def test_redaction_takes_every_value_longest_first_and_lines_of_a_multiline_one():
    pem = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0\n-----END KEY-----"
    text = f"a {SECRET} b {SECRET}x\nkey line: MIIEvQIBADANBgkqhkiG9w0\nshort ab\n"
    assert redact(text, [SECRET, SECRET[:6], pem, ""]) == (
        f"a {REDACTED} b {REDACTED}x\nkey line: {REDACTED}\nshort ab\n")
    assert lease_tail("x\x00" + SECRET, [SECRET]) == f"x{REDACTED}"


def test_a_process_workload_gets_its_secrets_in_its_environment(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    runtime.start(_lease(52, ["sh", "-c", 'echo "$MODE:$MY_TOKEN:$GPUMARKET_LEASE_ID"']))
    wait_for(lambda: runtime.exit_status(52) is not None)
    assert runtime.logs(52, 5) == f"train:{SECRET}:52\n"
    # the runner's own state file never holds them
    assert not any(SECRET in p.read_text(errors="replace")
                   for p in tmp_path.rglob("*.json") if p.is_file())
    runtime.stop(52, 1)


@pytest.fixture
def agent_for(marketplace: FakeMarketplace, docker_client, docker_node, tmp_path):
    clients = []

    def make(runtime: str):
        client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
        clients.append(client)
        if runtime == "docker":
            workloads = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                                      simulate=True)
            dump = H100
        else:
            workloads, dump = ProcessRuntime(tmp_path / "state"), A10
        lines: list[str] = []
        agent = Agent(client, DumpGpus(dump), workloads, poll_interval=0.2, grace_s=1,
                      logs_interval=0, log=lines.append)
        agent.announce()
        return agent, lines

    yield make
    for client in clients:
        client.close()


@pytest.mark.docker
def test_a_docker_workload_printing_its_secret_posts_it_redacted(agent_for, marketplace,
                                                                test_image, docker_client):
    agent, lines = agent_for("docker")
    marketplace.add_lease(61, UUIDS, image=test_image,
                          command=["sh", "-c", "echo token=$MY_TOKEN; sleep 1; echo done"],
                          secrets={"MY_TOKEN": SECRET})
    agent.tick()
    [container] = docker_client.containers.list(all=True,
                                                filters={"label": "gpumarket.lease=61"})
    assert f"MY_TOKEN={SECRET}" in container.attrs["Config"]["Env"]  # it got it
    wait_for(lambda: (agent.tick() or True) and marketplace.leases[61]["status"] == "completed")
    assert marketplace.logs[61][-1] == f"token={REDACTED}\ndone\n"
    assert not any(SECRET in tail for tail in marketplace.logs[61])
    assert not any(SECRET in line for line in lines)  # nor in the runner's own log


def test_a_process_workload_printing_its_secret_posts_it_redacted(agent_for, marketplace):
    agent, lines = agent_for("process")
    marketplace.add_lease(62, [], image="ignored",
                          command=["sh", "-c", "echo token=$MY_TOKEN >&2; echo done"],
                          secrets={"MY_TOKEN": SECRET})
    wait_for(lambda: (agent.tick() or True) and marketplace.leases[62]["status"] == "completed")
    assert marketplace.logs[62][-1] == f"token={REDACTED}\ndone\n"
    assert not any(SECRET in line for line in lines)
