"""Lease container resource limits (providers/runner/limits.py): the rule, the provider's
overrides (flag > environment > config.json), and the real Docker Engine's HostConfig and
what the container itself sees."""

from __future__ import annotations

import math

import pytest

from providers.runner.cli import CliError, build_parser, resource_policy
from providers.runner.limits import GiB, MiB, ResourcePolicy, parse_size
from providers.runner.runtime import DockerRuntime

from .runner_helpers import lease_for

TiB = 2**40


def test_the_default_rule_is_the_leases_share_of_the_host():
    # 4 of 8 GPUs on a host of 2 TiB and 224 CPUs: half of each; shm capped at 16 GiB
    limits = ResourcePolicy().limits(4, 8, 2 * TiB, 224)
    assert (limits.memory, limits.cpus, limits.pids, limits.shm_size) == (
        TiB, 112, 4096, 16 * GiB)
    # 1 of 8 on a small host: shm is half the memory limit
    limits = ResourcePolicy().limits(1, 8, 16 * GiB, 2)
    assert (limits.memory, limits.cpus, limits.shm_size) == (2 * GiB, 0.25, GiB)
    # node size unknown, or fewer than leased: the whole host
    assert ResourcePolicy().limits(2, None, 8 * GiB, 4).memory == 8 * GiB
    assert ResourcePolicy().limits(2, 1, 8 * GiB, 4).cpus == 4
    kwargs = ResourcePolicy().limits(1, 8, 16 * GiB, 2).docker_kwargs()
    assert kwargs == {"mem_limit": 2 * GiB, "memswap_limit": 2 * GiB,
                      "nano_cpus": 250_000_000, "pids_limit": 4096, "shm_size": GiB}


def test_overrides_scale_with_the_leased_gpus_and_stay_within_bounds():
    policy = ResourcePolicy(memory_per_gpu=64 * GiB, cpus_per_gpu=12, pids_limit=512,
                            shm_size=8 * GiB)
    limits = policy.limits(2, 8, TiB, 224)
    assert (limits.memory, limits.cpus, limits.pids, limits.shm_size) == (
        128 * GiB, 24, 512, 8 * GiB)
    # CPUs never above the host's (Docker refuses); shm never above the memory limit
    limits = ResourcePolicy(cpus_per_gpu=8, memory_per_gpu=GiB, shm_size=4 * GiB).limits(
        2, 8, TiB, 4)
    assert (limits.cpus, limits.shm_size) == (4, 2 * GiB)
    # tiny shares are floored, never zero
    limits = ResourcePolicy().limits(1, 64, 1 * GiB, 0.5)
    assert limits.memory == 64 * MiB and limits.cpus == 0.01
    with pytest.raises(ValueError, match="pids_limit"):
        ResourcePolicy(pids_limit=0)
    with pytest.raises(ValueError, match="memory_per_gpu"):
        ResourcePolicy(memory_per_gpu=-1)


def test_parse_size_reads_docker_style_sizes():
    assert parse_size("512m") == 512 * MiB
    assert parse_size("64g") == parse_size("64GiB") == parse_size("64 GB") == 64 * GiB
    assert parse_size("1.5t") == int(1.5 * TiB)
    assert parse_size("1048576") == parse_size(1048576) == MiB
    for bad in ("", "lots", "-1g", "0", "12 parsecs"):
        with pytest.raises(ValueError):
            parse_size(bad)


def _run_args(*flags: str):
    return build_parser().parse_args(["run", *flags])


def test_flags_beat_environment_beat_config_beat_default():
    config = {"limits": {"memory_per_gpu": "32g", "cpus_per_gpu": 6, "pids_limit": 1000,
                         "shm_size": "2g"}}
    env = {"GPUMARKET_RUNNER_MEMORY_PER_GPU": "48g", "GPUMARKET_RUNNER_PIDS_LIMIT": "2000"}
    policy = resource_policy(_run_args("--memory-per-gpu", "64g"), config, env)
    assert policy == ResourcePolicy(memory_per_gpu=64 * GiB, cpus_per_gpu=6.0, pids_limit=2000,
                                    shm_size=2 * GiB)
    assert resource_policy(_run_args(), config, env).memory_per_gpu == 48 * GiB
    assert resource_policy(_run_args(), {}, {}) == ResourcePolicy()


@pytest.mark.parametrize(("flags", "config", "env", "named"), [
    (("--memory-per-gpu", "lots"), {}, {}, "--memory-per-gpu: 'lots' is not a size"),
    (("--cpus-per-gpu", "0"), {}, {}, "--cpus-per-gpu: '0' must be more than 0"),
    ((), {}, {"GPUMARKET_RUNNER_PIDS_LIMIT": "4.5"}, "GPUMARKET_RUNNER_PIDS_LIMIT: '4.5'"),
    ((), {"limits": {"shm_size": "big"}}, {}, 'config.json "limits.shm_size": \'big\''),
    ((), {"limits": "16g"}, {}, '"limits" must be an object'),
])
def test_a_bad_limit_names_where_it_came_from(flags, config, env, named):
    with pytest.raises(CliError) as error:
        resource_policy(_run_args(*flags), config, env)
    assert named in str(error.value)


@pytest.mark.docker
def test_docker_containers_get_the_default_limits(docker_client, test_image, docker_node):
    info = docker_client.info()
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    runtime.node_gpus = 8
    container_id = runtime.start(lease_for(51, test_image, ["sleep", "30"]))  # 2 GPUs
    host = docker_client.api.inspect_container(container_id)["HostConfig"]
    memory = info["MemTotal"] * 2 // 8 // MiB * MiB
    assert host["Memory"] == memory
    assert host["MemorySwap"] == memory  # no swap on top
    assert host["NanoCpus"] == round(math.floor(info["NCPU"] * 2 / 8 * 100) / 100 * 1e9)
    assert host["PidsLimit"] == 4096
    assert host["ShmSize"] == min(memory // 2, 16 * GiB)
    runtime.stop(51, grace_s=0)


@pytest.mark.docker
def test_docker_containers_get_the_providers_limits_and_feel_them(docker_client, test_image,
                                                                  docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    runtime.node_gpus, runtime.policy = 8, ResourcePolicy(
        memory_per_gpu=128 * MiB, cpus_per_gpu=0.25, pids_limit=64, shm_size=32 * MiB)
    container_id = runtime.start(lease_for(52, test_image, ["sleep", "30"]))  # 2 GPUs
    host = docker_client.api.inspect_container(container_id)["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"], host["ShmSize"]) == (
        256 * MiB, 500_000_000, 64, 32 * MiB)
    container = docker_client.containers.get(container_id)
    code, out = container.exec_run(["busybox", "df", "-k", "/dev/shm"])
    assert code == 0 and " 32768 " in out.decode(), out  # the tmpfs is 32 MiB inside
    runtime.stop(52, grace_s=0)
