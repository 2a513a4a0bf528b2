"""Cold starts from a real registry (docs/IMAGES.md): the runner pulls a lease's image in
the background with progress sent as `starting` events, fails the lease when the pull
fails, keeps an LRU image cache with a size bound (never evicting an image a lease uses),
reports what it holds in its heartbeat and pre-pulls the wanted images while idle.
Real parts: Debian's docker-registry on 127.0.0.1, the Docker Engine, the runner's agent;
the marketplace is the stand-in of runner_helpers.py."""

from __future__ import annotations

import time

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.images import ImageCache, Prefetcher, parse_size
from providers.runner.nvml import DumpGpus
from providers.runner.pull import normalize, split_ref
from providers.runner.runtime import DockerRuntime
from tests.support.containers import inspected

from .runner_helpers import H100, TOKEN, FakeMarketplace

pytestmark = pytest.mark.docker

UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9"]
MIB = 1 << 20


@pytest.fixture
def parts(marketplace: FakeMarketplace, docker_client, docker_node, tmp_path):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    lines: list[str] = []
    cache = ImageCache(docker_client, tmp_path / "images.json", 1 << 40, log=lines.append)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True, images=cache)
    runtime.puller.allow_private_registry = True  # the test registry is on 127.0.0.1
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  log=lines.append)
    yield agent, runtime, lines
    client.close()


def tick_until(agent: Agent, what: str, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.tick()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_refs_in_the_engines_form():
    assert split_ref("127.0.0.1:5000/a/b:1") == ("127.0.0.1:5000/a/b", "1")
    assert split_ref("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    assert normalize("docker.io/library/busybox") == "busybox:latest"
    assert normalize("pytorch/pytorch:2.5.1") == "pytorch/pytorch:2.5.1"
    assert parse_size("200g") == 200 << 30 and parse_size("512MiB") == 512 << 20
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_a_cold_image_is_pulled_with_progress_then_the_lease_runs(
        parts, marketplace, docker_client, docker_node, cold_image):
    agent, runtime, _lines = parts
    ref = cold_image(24, layers=3)
    marketplace.add_lease(31, UUIDS, image=ref, command=["sleep", "60"])

    agent.tick()  # starting, the pull begins in the background; nothing runs yet
    assert [e["status"] for e in marketplace.events_for(31)][:1] == ["starting"]
    assert inspected(docker_client, label=f"gpumarket.node={docker_node}") == []
    tick_until(agent, "the lease to run", lambda: any(
        e["status"] == "running" for e in marketplace.events_for(31)))

    events = marketplace.events_for(31)
    statuses = [e["status"] for e in events]
    assert statuses[-1] == "running" and set(statuses[:-1]) == {"starting"}
    causes = [e.get("cause", "") for e in events if e["status"] == "starting"]
    assert any(c.startswith(f"pulling image {ref}") for c in causes), causes
    assert causes[-1].startswith(f"image {ref} pulled in "), causes
    [container] = inspected(docker_client, label=f"gpumarket.node={docker_node}")
    assert container.attrs["Config"]["Image"] == ref
    assert runtime.images.pulled[ref]["bytes"] >= 24 * MIB  # recorded, most recently used
    assert runtime.images.pulled[ref]["used"] > 0
    # the heartbeat reports it, once: the next heartbeat (nothing changed) leaves it out
    agent._next_heartbeat = 0.0
    agent.tick()
    reported = marketplace.heartbeats[-1]["images"]
    assert {"image": ref, "bytes": runtime.images.pulled[ref]["bytes"]} in reported
    agent._next_heartbeat = 0.0
    agent.tick()
    assert "images" not in marketplace.heartbeats[-1]


def test_a_failed_pull_fails_the_lease_with_its_cause(parts, marketplace, image_registry):
    agent, _runtime, _lines = parts
    missing = image_registry.ref("test/never-pushed", "9")
    marketplace.add_lease(32, UUIDS, image=missing, command=["true"])
    tick_until(agent, "the lease to fail", lambda: any(
        e["status"] == "failed" for e in marketplace.events_for(32)))
    events = marketplace.events_for(32)
    assert "running" not in [e["status"] for e in events]  # never ran: never charged
    [failed] = [e for e in events if e["status"] == "failed"]
    assert failed["cause"].startswith(f"image {missing} could not be pulled: ")
    assert "not found" in failed["cause"] or "unknown" in failed["cause"], failed["cause"]
    assert "usage_seconds" not in failed


def test_lru_eviction_keeps_the_bound_and_never_an_image_in_use(docker_client, tmp_path,
                                                                cold_image, test_image):
    lines: list[str] = []
    cache = ImageCache(docker_client, tmp_path / "images.json", 1 << 40, log=lines.append)
    refs = [cold_image(6) for _ in range(3)]
    for ref in refs:
        docker_client.images.pull(*split_ref(ref))
        cache.pulled_now(ref)
        time.sleep(0.01)
    cache.used(refs[0])  # order by last use now: refs[1], refs[2], refs[0]
    size = cache.pulled[refs[0]]["bytes"]
    cache.bound = 2 * size  # room for two
    removed = cache.evict(in_use={refs[1], test_image})  # refs[1] is the oldest, in use
    assert removed == [refs[2]]
    assert cache.present(refs[0]) and cache.present(refs[1]) and not cache.present(refs[2])
    assert cache.present(test_image)  # a local image the runner did not pull: never evicted
    assert any(f"evicted {refs[2]}" in line for line in lines)
    # a restarted runner reads the same record
    again = ImageCache(docker_client, tmp_path / "images.json", 2 * size)
    assert set(again.pulled) == {refs[0], refs[1]}
    # everything in use and over the bound: nothing is removed, and it says so once
    again.bound = size // 2
    assert again.evict(in_use={refs[0], refs[1]}) == []
    assert again.present(refs[0]) and again.present(refs[1])


def test_the_idle_runner_pre_pulls_the_wanted_images(parts, marketplace, cold_image):
    agent, runtime, lines = parts
    wanted = cold_image(4)
    marketplace.wanted_images = [wanted]
    agent.prefetcher = Prefetcher(runtime.images, runtime.puller,
                                  agent.client.images_wanted, log=lines.append)
    tick_until(agent, "the pre-pull", lambda: wanted in agent.prefetcher.done)
    assert runtime.images.present(wanted)
    assert runtime.images.pulled[wanted]["used"] == 0  # never used: evicted first
    assert any(f"pre-pulled {wanted}" in line for line in lines)
    # a lease of it now starts at once, without a pull
    marketplace.add_lease(33, UUIDS, image=wanted, command=["sleep", "30"])
    agent.tick()
    statuses = [e["status"] for e in marketplace.events_for(33)]
    assert statuses == ["starting", "running"]


def test_a_private_registry_is_neither_pulled_nor_pre_pulled_unless_allowed(
        parts, marketplace, cold_image):
    agent, runtime, lines = parts
    runtime.puller.allow_private_registry = False  # the runner without the flag
    ref = cold_image(4)  # in the registry on 127.0.0.1, not on the engine
    marketplace.add_lease(34, UUIDS, image=ref, command=["true"])
    tick_until(agent, "the lease to fail", lambda: any(
        e["status"] == "failed" for e in marketplace.events_for(34)))
    [failed] = [e for e in marketplace.events_for(34) if e["status"] == "failed"]
    assert failed["cause"].startswith(f"image {ref} could not be pulled: registry 127.0.0.1 "
                                      "is a loopback address"), failed["cause"]
    assert "--allow-private-registry" in failed["cause"]
    assert not runtime.images.present(ref)
    marketplace.wanted_images = [ref]
    agent.prefetcher = Prefetcher(runtime.images, runtime.puller,
                                  agent.client.images_wanted, log=lines.append)
    tick_until(agent, "the refused pre-pull", lambda: any(
        f"pre-pull of {ref} failed: registry 127.0.0.1" in line for line in lines))
    assert not runtime.images.present(ref) and agent.prefetcher.done == []
