"""Pulls that stall, and progress that reads right (docs/IMAGES.md, "Stalled pulls"):
a registry stopped with SIGSTOP mid-pull (and before it) fails the lease within the
stall timeout with the stall as cause; the progress of a real pull never goes backwards,
says "of at least" while some layer's size is unknown and "extracting layers" after the
download; a pre-pull that cannot fit is not pulled again. Real parts: Debian's
docker-registry on 127.0.0.1, the Docker Engine, the runner's agent."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.images import ImageCache, Prefetcher
from providers.runner.nvml import DumpGpus
from providers.runner.pull import Puller, PullState, split_ref
from providers.runner.runtime import DockerRuntime

from .runner_helpers import H100, TOKEN, FakeMarketplace

pytestmark = pytest.mark.docker

UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9"]


@pytest.fixture
def agent_with(marketplace: FakeMarketplace, docker_client, docker_node, tmp_path):
    """agent_with(puller) → an agent whose Docker runtime pulls with `puller`."""
    clients = []

    def make(puller: Puller) -> Agent:
        client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
        clients.append(client)
        cache = ImageCache(docker_client, tmp_path / "images.json", 1 << 40)
        runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                                simulate=True, images=cache)
        runtime.puller = puller
        return Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                     log=lambda line: None)

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def stopper(image_registry):
    """stop() sends SIGSTOP to the session's registry; SIGCONT afterwards, always."""
    stopped = []

    def stop() -> None:
        os.kill(image_registry.proc.pid, signal.SIGSTOP)
        stopped.append(True)

    yield stop
    if stopped:
        os.kill(image_registry.proc.pid, signal.SIGCONT)


def failed_cause(agent: Agent, marketplace: FakeMarketplace, lease_id: int,
                 timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.tick()
        failed = [e for e in marketplace.events_for(lease_id) if e["status"] == "failed"]
        if failed:
            return failed[0]["cause"]
        time.sleep(0.1)
    raise AssertionError(f"lease {lease_id} did not fail in {timeout} s")


def test_a_registry_stalled_mid_pull_fails_the_lease_after_the_stall_timeout(
        agent_with, marketplace, docker_client, cold_image, stopper):
    ref = cold_image(96, layers=3)
    puller = Puller(stall_timeout=2.0, allow_private_registry=True)

    stopped: list[bool] = []

    def stop_at_first_bytes(ref_: str, on_message) -> None:
        def watch(msg: dict) -> None:
            if msg.get("status") == "Downloading" and not stopped:
                stopper()  # the registry stops with the first bytes: mid-download
                stopped.append(True)
            on_message(msg)
        puller.docker_pull(ref_, watch)

    puller._pull_fn = stop_at_first_bytes
    agent = agent_with(puller)
    marketplace.add_lease(41, UUIDS, image=ref, command=["true"])
    began = time.monotonic()
    cause = failed_cause(agent, marketplace, 41)
    took = time.monotonic() - began
    assert re.fullmatch(rf"image {re.escape(ref)} could not be pulled: no progress for "
                        r"[2-9] s \(the registry stalled\)", cause), cause
    assert took < 20, took  # within a few stall timeouts, not 12 minutes
    statuses = [e["status"] for e in marketplace.events_for(41)]
    assert "running" not in statuses  # never ran: never charged
    causes = [e.get("cause", "") for e in marketplace.events_for(41)]
    # the buyer was told of the pull before its failure (a MiB line only when the
    # throttled progress report fell before the stop: timing, not a rule)
    assert any(c.startswith(f"pulling image {ref}: ") for c in causes), causes
    assert not ImageCache(docker_client, None).present(ref)


def test_a_registry_stopped_before_the_pull_fails_it_too(agent_with, marketplace,
                                                         image_registry, stopper):
    stopper()
    agent = agent_with(Puller(stall_timeout=1.0, allow_private_registry=True))
    ref = image_registry.ref("test/never-answered", "1")
    marketplace.add_lease(42, UUIDS, image=ref, command=["true"])
    cause = failed_cause(agent, marketplace, 42, timeout=30)
    assert cause.startswith(f"image {ref} could not be pulled: no progress for "), cause
    assert cause.endswith("(the registry stalled)"), cause


def test_the_progress_of_a_real_pull_never_goes_backwards(docker_client, cold_image):
    ref = cold_image(48, layers=3)
    puller = Puller(allow_private_registry=True)
    seen: list[tuple[str, int, int]] = []

    def record(ref_: str, on_message) -> None:
        def watch(msg: dict) -> None:
            on_message(msg)
            state = puller.state(ref_)
            seen.append((state.text(), state.done, state.total))
        puller.docker_pull(ref_, watch)

    puller._pull_fn = record
    state = puller.ensure(ref)
    deadline = time.monotonic() + 120
    while state.phase == "pulling" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.phase == "done", state.text()
    texts = [t for t, _, _ in seen]
    assert any("extracting layers (" in t and " of 3)" in t for t in texts), texts
    pcts = [int(m.group(1)) for t in texts if (m := re.search(r"\((\d+) %\)", t))]
    assert pcts == sorted(pcts), pcts
    dones = [d for _, d, _ in seen]
    assert dones == sorted(dones)
    # a total is final once stated without "at least"; before, it says so
    final = [tot for t, _, tot in seen if "%" in t]
    assert final and len(set(final)) == 1 and final[0] >= 48 << 20
    assert all("of at least" in t for t, _, tot in seen if tot < final[0] and "MiB of" in t)
    extracting = [i for i, t in enumerate(texts) if "extracting" in t]
    assert not any("%" in t for t in texts[extracting[0]:]), texts  # no return to bytes


def test_a_pull_a_previous_runner_began_says_it_starts_again(agent_with, marketplace,
                                                             cold_image):
    ref = cold_image(8)
    agent = agent_with(Puller(allow_private_registry=True))
    # the lease is `starting` already: a previous runner process began it, then restarted
    marketplace.add_lease(43, UUIDS, image=ref, command=["sleep", "30"], status="starting")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            e["status"] == "running" for e in marketplace.events_for(43)):
        agent.tick()
        time.sleep(0.1)
    causes = [e.get("cause", "") for e in marketplace.events_for(43)
              if e["status"] == "starting"]
    assert causes[0].startswith(f"pulling image {ref} again (the runner restarted): "), causes
    assert causes[-1].startswith(f"image {ref} pulled in "), causes
    # a lease this process saw pending pulls without "again"
    fresh = cold_image(4)
    marketplace.add_lease(44, UUIDS, image=fresh, command=["true"])
    agent.tick()
    first = [e.get("cause", "") for e in marketplace.events_for(44) if e.get("cause")]
    assert first and first[0].startswith(f"pulling image {fresh}: "), first


def test_progress_text_while_sizes_are_unknown_and_while_extracting():
    state = PullState("r:1", layers=2, total=100 << 20, done=10 << 20, sized=False)
    assert state.text() == "pulling image r:1: 10 MiB of at least 100 MiB, 0 of 2 layers"
    state.sized = True
    assert state.text() == "pulling image r:1: 10 MiB of 100 MiB (10 %), 0 of 2 layers"
    state.done, state.downloaded, state.complete = 100 << 20, 2, 1
    assert state.text() == ("pulling image r:1: 100 MiB downloaded, extracting layers "
                            "(2 of 2)")
    state.complete = 2
    assert state.text() == "pulling image r:1: 100 MiB downloaded, 2 of 2 layers in place"


def test_an_evicted_image_that_cannot_fit_is_not_pre_pulled_again(docker_client, tmp_path,
                                                                   cold_image):
    used, wanted = cold_image(6), cold_image(6)
    for ref in (used, wanted):
        docker_client.images.pull(*split_ref(ref))
    lines: list[str] = []
    cache = ImageCache(docker_client, tmp_path / "images.json", 1 << 40, log=lines.append)
    cache.pulled_now(wanted, prefetch=True)
    cache.pulled_now(used)
    cache.bound = cache.pulled[used]["bytes"] + cache.pulled[wanted]["bytes"] // 2
    assert cache.evict(in_use={used}) == [wanted]  # the pre-pull did not fit
    assert cache.sizes[wanted] > 0 and not cache.present(wanted)

    again = ImageCache(docker_client, tmp_path / "images.json", cache.bound,
                       log=lines.append)  # a restarted runner remembers the size
    puller = Puller(allow_private_registry=True)
    prefetcher = Prefetcher(again, puller, lambda: [wanted], log=lines.append)
    prefetcher.tick(idle=True, in_use=lambda: {used})
    assert puller.pulls == {} and prefetcher.current is None  # not pulled
    assert any(f"{wanted} not pre-pulled" in line for line in lines), lines
    # with room (the bound grown), it is pulled again once its skip has passed
    again.bound = 1 << 40
    prefetcher._skip.clear()
    prefetcher.tick(idle=True, in_use=lambda: {used})
    assert prefetcher.current == wanted
    deadline = time.monotonic() + 60
    while puller.busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    prefetcher.tick(idle=True, in_use=lambda: {used})
    assert prefetcher.done == [wanted] and again.present(wanted)
    assert wanted not in again.sizes  # held again: its size is in the record
