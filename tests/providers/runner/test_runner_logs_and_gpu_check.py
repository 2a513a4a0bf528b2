"""Log tails for the buyer and the in-container GPU check, with the real Docker Engine,
real local processes and the stand-in marketplace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.logtail import LOG_MAX_BYTES, trim_tail
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime, ProcessRuntime, listed_uuids

from .runner_helpers import DUMPS, H100, TOKEN, FakeMarketplace, wait_for
from .runner_helpers import LEASE_UUIDS as UUIDS
from .runner_helpers import lease_for as lease

OTHER = "GPU-9ae5a0c1-0cd3-9b2a-5bd7-6dbb0d3da5d5"
LOOP = "i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo $i; done"  # the image has no seq






# -- trimming ---------------------------------------------------------------------------------
def test_trim_tail_keeps_the_last_64_kib_from_a_line_start_without_nul():
    text = "".join(f"line {i:06d} é\n" for i in range(10_000))  # ~150 KiB
    tail = trim_tail(text + "last\x00 line\n")
    assert len(tail.encode()) <= LOG_MAX_BYTES
    assert tail.startswith("line ") and tail.endswith("last line\n")
    assert "\x00" not in tail
    assert trim_tail("short\n") == "short\n"
    huge = "x" * (LOG_MAX_BYTES * 2)  # one line longer than the limit: cut mid-line
    assert len(trim_tail(huge).encode()) == LOG_MAX_BYTES


# -- runtimes ---------------------------------------------------------------------------------
@pytest.mark.docker
def test_docker_logs_are_the_last_lines(docker_client, test_image, docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    # the engine copies stdout and stderr separately: without the pause, "oops" can be
    # logged long before the last numbers (seen: right after 253)
    runtime.start(lease(51, test_image, ["sh", "-c", LOOP + "; sleep 1; echo oops >&2; "
                                         "sleep 30"]))
    text = wait_for(lambda: "oops" in runtime.logs(51, 5) and runtime.logs(51, 5))
    # stdout and stderr both come, as the last 5 lines
    assert text.splitlines() == ["297", "298", "299", "300", "oops"]


def test_process_logs_are_the_last_lines(tmp_path):
    runtime = ProcessRuntime(tmp_path)
    runtime.start(lease(52, "ignored", ["sh", "-c", LOOP + "; echo done >&2"]))
    wait_for(lambda: runtime.exit_status(52) is not None)
    assert runtime.logs(52, 3).splitlines() == ["299", "300", "done"]
    assert runtime.verify_gpus(lease(52, "ignored", ["true"])) is None
    runtime.stop(52, 1)


@pytest.mark.docker
def test_simulated_gpu_check_reads_the_container_env(docker_client, test_image, docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    runtime.start(lease(53, test_image, ["sleep", "30"]))
    assert runtime.verify_gpus(lease(53, test_image, ["sleep", "30"])) is None
    assert runtime.last_check == f"`nvidia-smi -L (simulated)` sees {','.join(sorted(UUIDS))}"
    # the container was started for other GPUs than these: the evidence names both sets
    evidence = runtime.verify_gpus(lease(53, test_image, ["sleep", "30"], uuids=[UUIDS[0]]))
    assert evidence == (f"container sees {','.join(sorted(UUIDS))}; leased {UUIDS[0]} "
                        "(`nvidia-smi -L (simulated)`)")


@pytest.mark.docker
def test_gpu_check_of_an_exited_container_is_not_a_mismatch(docker_client, test_image,
                                                            docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    runtime.start(lease(54, test_image, ["true"]))
    wait_for(lambda: runtime.exit_status(54) is not None)
    assert runtime.verify_gpus(lease(54, test_image, ["true"])) is None
    assert runtime.last_check.startswith("`nvidia-smi -L (simulated)` could not run")


class _ExecOnly:
    """A container whose `nvidia-smi -L` prints `out` (the real path needs a GPU)."""

    def __init__(self, out: str, code: int = 0) -> None:
        self.out, self.code, self.commands = out.encode(), code, []

    def exec_run(self, command, **kwargs):
        self.commands.append(command)
        return self.code, self.out


NVSMI_L = (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[0]})\n"
           f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[1]})\n")
NVSMI_MIG = (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUIDS[0]})\n"
             "  MIG 1g.10gb     Device  0: (UUID: MIG-8f3c0f67-8d5e-5e4b-9d0e-3c1b2a0f9e11)\n")


@pytest.mark.docker
@pytest.mark.parametrize(("out", "uuids", "expected"), [
    (NVSMI_L, UUIDS, None),
    (NVSMI_L, [UUIDS[0]],
     f"container sees {','.join(sorted(UUIDS))}; leased {UUIDS[0]} (`nvidia-smi -L`)"),
    (NVSMI_MIG, ["MIG-8f3c0f67-8d5e-5e4b-9d0e-3c1b2a0f9e11"], None),
    ("No devices were found\n", [UUIDS[0]],
     f"container sees no GPU; leased {UUIDS[0]} (`nvidia-smi -L`)"),
])
def test_real_gpu_check_compares_nvidia_smi_uuids(docker_client, docker_node, monkeypatch,
                                                  out, uuids, expected):
    runtime = DockerRuntime(docker_node, client=docker_client, simulate=False)
    container = _ExecOnly(out)
    monkeypatch.setattr(runtime, "_containers", lambda lease_id=None: [container])
    assert runtime.verify_gpus(lease(55, "img", ["x"], uuids=uuids)) == expected
    assert container.commands == [["nvidia-smi", "-L"]]


@pytest.mark.docker
def test_real_gpu_check_that_cannot_run_is_reported_unverified(docker_client, docker_node,
                                                               monkeypatch):
    runtime = DockerRuntime(docker_node, client=docker_client, simulate=False)
    monkeypatch.setattr(runtime, "_containers",
                        lambda lease_id=None: [_ExecOnly("exec: nvidia-smi: not found", 127)])
    assert runtime.verify_gpus(lease(56, "img", ["x"])) is None
    assert runtime.last_check == "`nvidia-smi -L` exited with status 127"


# -- the agent --------------------------------------------------------------------------------
@pytest.fixture
def agent_for(marketplace: FakeMarketplace, docker_client, docker_node):
    clients = []

    def make(runtime_class=DockerRuntime, **kwargs):
        client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
        clients.append(client)
        runtime = runtime_class(docker_node, client=docker_client, network_mode="none",
                                simulate=True)
        lines: list[str] = []
        agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                      log=lines.append, **kwargs)
        agent.announce()
        return agent, lines

    yield make
    for client in clients:
        client.close()


@pytest.mark.docker
def test_agent_sends_changed_tails_and_the_final_one(agent_for, marketplace, test_image):
    agent, _lines = agent_for(logs_interval=0)
    script = "echo hello; sleep 1.5; echo bye; exit 3"
    marketplace.add_lease(61, UUIDS, image=test_image, command=["sh", "-c", script])
    agent.tick()  # started, GPUs checked, running; first tail sent
    wait_for(lambda: (agent.tick() or True) and marketplace.logs.get(61, [""])[-1] == "hello\n")
    agent.tick()
    assert marketplace.logs[61].count("hello\n") == 1  # unchanged: not sent again
    wait_for(lambda: (agent.tick() or True) and marketplace.leases[61]["status"] == "failed")
    assert marketplace.logs[61][-1] == "hello\nbye\n"  # the final tail, before removal
    assert agent._sent_tails == {}


@pytest.mark.docker
def test_agent_fails_a_lease_whose_container_sees_other_gpus(agent_for, marketplace,
                                                            docker_client, docker_node,
                                                            test_image):
    class WrongGpus(DockerRuntime):
        def start(self, lease):  # a broken device mapping: one GPU too many
            return super().start(replace(lease, gpu_uuids=[*lease.gpu_uuids, OTHER]))

    agent, lines = agent_for(WrongGpus)
    marketplace.add_lease(62, [UUIDS[0]], image=test_image, command=["sleep", "30"])
    agent.tick()

    events = marketplace.events_for(62)
    assert [e["status"] for e in events] == ["starting", "failed"]
    seen = ",".join(sorted([UUIDS[0], OTHER]))
    assert events[1]["cause"] == (f"GPU check failed: container sees {seen}; "
                                  f"leased {UUIDS[0]} (`nvidia-smi -L (simulated)`)")
    assert docker_client.containers.list(
        all=True, filters={"label": f"gpumarket.node={docker_node}"}) == []
    assert any(line.startswith("lease 62: failed: GPU check failed") for line in lines)


MIG_LISTING = DUMPS / "h100-80gb-hbm3-mig-x1.utku-exporter-590.48.01.L.txt"
MIG_1G = ["MIG-00000002-0000-0000-0000-000000000002", "MIG-00000003-0000-0000-0000-000000000003"]


def test_the_gpu_check_reads_a_recorded_mig_listing():
    """`nvidia-smi -L` of the recorded MIG H100 names the parent GPU and its 4 MIG
    devices: a lease of slices is compared with the MIG devices only."""
    text = MIG_LISTING.read_text()
    assert listed_uuids(text, MIG_1G) == [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}"
                                          for i in range(4)]
    assert listed_uuids(text, [UUIDS[0]]) == ["GPU-00000000-0000-0000-0000-000000000000"]


@pytest.mark.docker
def test_a_simulated_lease_of_mig_slices_is_checked_by_its_mig_uuids(docker_client, test_image,
                                                                     docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    runtime.start(lease(57, test_image, ["sleep", "30"], uuids=MIG_1G))
    assert runtime.verify_gpus(lease(57, test_image, ["sleep", "30"], uuids=MIG_1G)) is None
    assert runtime.last_check == f"`nvidia-smi -L (simulated)` sees {','.join(MIG_1G)}"
    other = ["MIG-00000000-0000-0000-0000-000000000000", MIG_1G[0]]
    assert runtime.verify_gpus(lease(57, test_image, ["x"], uuids=other)) == (
        f"container sees {','.join(MIG_1G)}; leased {','.join(other)} "
        "(`nvidia-smi -L (simulated)`)")
