"""A lease's workspace and checkpoints on the runner (providers/runner/workspace.py,
checkpoint.py) with real parts: the Docker Engine (the busybox test image), moto's S3
server on 127.0.0.1 with credentials enforced (tests/support/s3.py), and the stand-in
marketplace of these tests. The workload writes /workspace/checkpoint/state.txt; its
lease stopped, the file is in the bucket under the chain's prefix with a manifest; the next
lease of the chain gets it back before its workload starts."""

from __future__ import annotations

import json
import random

import pytest

from providers.runner.agent import Agent
from providers.runner.checkpoint import CheckpointStore, CheckpointSync, _open_inside
from providers.runner.client import MarketplaceClient
from providers.runner.lease import RunnerLease
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime
from providers.runner.workspace import Workspaces, regular_files

from .runner_helpers import H100, TOKEN, wait_for
from .runner_helpers import LEASE_UUIDS as UUIDS

WRITE = ("mkdir -p /workspace/checkpoint && echo step-42 > /workspace/checkpoint/state.txt"
         " && mkdir -p /workspace/checkpoint/opt && echo adam > /workspace/checkpoint/opt/m"
         " && ln -s /etc/hostname /workspace/checkpoint/host-file && echo written && sleep 300")
READ = "cat /workspace/checkpoint/state.txt /workspace/checkpoint/opt/m"


@pytest.fixture
def bucket(s3_server):
    return s3_server.bucket(f"ckpt-runner-{random.randint(10**5, 10**6)}")


@pytest.fixture
def agent(marketplace, docker_client, docker_node, tmp_path):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True, workspaces=Workspaces(tmp_path / "workspaces"))
    lines: list[str] = []
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  logs_interval=0, log=lines.append)
    agent.announce()
    agent.lines = lines
    yield agent
    agent.checkpoints.join(30)
    client.close()


def _store(s3_server, bucket: str, chain: int, *, restore: bool, **changes) -> dict:
    return {"endpoint_url": s3_server.endpoint_url, "bucket": bucket, "prefix": f"{chain}/",
            "region": "", "access_key_id": s3_server.access_key_id,
            "secret_access_key": s3_server.secret_access_key,
            "path": "/workspace/checkpoint", "max_bytes": 1_000_000, "restore": restore,
            **changes}


def _until(agent, marketplace, lease_id: int, status: str, timeout: float = 20) -> None:
    wait_for(lambda: (agent.tick() or True) and marketplace.leases[lease_id]["status"]
             == status, timeout=timeout)


@pytest.mark.docker
def test_a_stopped_lease_uploads_its_checkpoint_and_the_next_lease_restores_it(
        agent, marketplace, test_image, s3_server, bucket, tmp_path):
    marketplace.add_lease(71, UUIDS, image=test_image, command=["sh", "-c", WRITE],
                          chain_id=71, checkpoint=_store(s3_server, bucket, 71, restore=False))
    _until(agent, marketplace, 71, "running")
    wait_for(lambda: "written" in agent.runtime.logs(71, 5))
    assert (tmp_path / "workspaces" / "lease-71" / "checkpoint" / "state.txt").read_text() \
        == "step-42\n"  # the workspace is a host directory
    # the notice sequence's call once the notice is delivered, the container running
    agent.checkpoints.upload(agent._leases[0], "notice", delay_s=0.1)
    agent.checkpoints.join(30)
    marketplace.leases[71]["status"] = "cancelled"  # the buyer's stop: no longer listed
    agent.tick()
    agent.checkpoints.join(30)
    keys = s3_server.keys(bucket, "71/")
    first, manifest_key = [k for k in keys if k.endswith("/manifest.json")]
    base = manifest_key.removesuffix("manifest.json")
    assert sorted(k for k in keys if k.startswith(base)) == sorted([
        manifest_key, f"{base}files/opt/m", f"{base}files/state.txt"])  # never the symlink
    assert s3_server.read(bucket, f"{base}files/state.txt") == b"step-42\n"
    manifest = json.loads(s3_server.read(bucket, manifest_key))
    assert manifest["bytes"] == 13 and manifest["lease"] == 71
    assert [f["path"] for f in manifest["files"]] == ["opt/m", "state.txt"]
    at_notice, report = marketplace.checkpoints[71]
    assert (at_notice["status"], at_notice["reason"], at_notice["key"]) == (
        "uploaded", "notice", first)
    assert (report["status"], report["reason"], report["bytes"], report["files"]) == (
        "uploaded", "stop", 13, 2)
    assert not (tmp_path / "workspaces" / "lease-71").exists()  # removed after the upload

    # the chain's next lease, on this runner: restored before its workload starts
    marketplace.add_lease(72, UUIDS, image=test_image, command=["sh", "-c", READ],
                          chain_id=71, checkpoint=_store(s3_server, bucket, 71, restore=True))
    _until(agent, marketplace, 72, "completed")
    agent.checkpoints.join(30)
    assert marketplace.logs[72][-1] == "step-42\nadam\n"
    restored, uploaded = marketplace.checkpoints[72][:2]
    assert (restored["status"], restored["reason"], restored["key"]) == (
        "restored", "restore", manifest_key)
    assert (uploaded["status"], uploaded["reason"]) == ("uploaded", "end")
    secret = s3_server.secret_access_key
    assert not any(secret in line for line in agent.lines)


@pytest.mark.docker
def test_wrong_credentials_fail_the_lease_before_its_workload_starts(
        agent, marketplace, test_image, s3_server, bucket, docker_client):
    marketplace.add_lease(73, UUIDS, image=test_image, command=["sh", "-c", "sleep 300"],
                          chain_id=70, checkpoint=_store(
                              s3_server, bucket, 70, restore=True,
                              secret_access_key="wrong-" + "x" * 30))
    _until(agent, marketplace, 73, "failed")
    [event] = [e for e in marketplace.events_for(73) if e["status"] == "failed"]
    assert event["cause"].startswith("checkpoint restore failed: ")
    assert "SignatureDoesNotMatch" in event["cause"]  # the store refused the key
    assert "usage_seconds" not in event  # it never ran: nothing to charge
    assert docker_client.containers.list(all=True, filters={"label": "gpumarket.lease=73"}) \
        == []
    [report] = marketplace.checkpoints[73]
    assert (report["status"], report["reason"]) == ("failed", "restore")


@pytest.mark.docker
def test_a_workspace_over_max_bytes_fails_the_lease_and_is_not_uploaded(
        agent, marketplace, test_image, s3_server, bucket):
    big = ("mkdir -p /workspace/checkpoint && head -c 5000 /dev/zero > "
           "/workspace/checkpoint/big && echo written && sleep 300")
    marketplace.add_lease(74, UUIDS, image=test_image, command=["sh", "-c", big],
                          chain_id=74, checkpoint=_store(s3_server, bucket, 74,
                                                         restore=False, max_bytes=4096))
    _until(agent, marketplace, 74, "failed", timeout=30)
    [event] = [e for e in marketplace.events_for(74) if e["status"] == "failed"]
    assert "over the bid's checkpoint max_bytes (4096)" in event["cause"]
    agent.checkpoints.join(30)
    [report] = marketplace.checkpoints[74]
    assert (report["status"], report["reason"]) == ("too_large", "failure")
    assert "max_bytes (4096 bytes)" in report["message"]
    assert s3_server.keys(bucket, "74/") == []


def test_a_half_written_upload_is_never_restored_and_a_damaged_one_is_skipped(
        s3_server, bucket, tmp_path):
    cfg = _store(s3_server, bucket, 80, restore=True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "state.txt").write_text("good\n")
    done = CheckpointStore(cfg).upload(src, 80, "/workspace/checkpoint")
    s3 = s3_server.client()
    # later uploads: one cut short (files, no manifest), one whose file was changed
    s3.put_object(Bucket=bucket, Key="80/29990101T000000000000Z-lease81/files/state.txt",
                  Body=b"half\n")
    (src / "state.txt").write_text("damaged\n")
    damaged = CheckpointStore(cfg).upload(src, 82, "/workspace/checkpoint")
    s3.put_object(Bucket=bucket, Key=damaged["key"].replace("manifest.json",
                                                            "files/state.txt"), Body=b"evil\n")
    dest = tmp_path / "ws" / "checkpoint"
    got = CheckpointStore(cfg).restore(dest)
    assert got["key"] == done["key"]
    assert (dest / "state.txt").read_text() == "good\n"


def test_a_manifest_naming_a_path_outside_the_workspace_is_refused(s3_server, bucket,
                                                                   tmp_path):
    cfg = _store(s3_server, bucket, 90, restore=True)
    manifest = {"version": 1, "lease": 90, "files": [
        {"path": "../../escaped", "bytes": 1, "sha256": "0" * 64}]}
    s3_server.client().put_object(Bucket=bucket, Key="90/20260101T000000000000Z-lease90/"
                                  "manifest.json", Body=json.dumps(manifest).encode())
    with pytest.raises(Exception, match="unsafe path") as refused:
        CheckpointStore(cfg).restore(tmp_path / "ws" / "checkpoint")
    assert refused.type.__name__ == "CheckpointError"
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "ws" / "escaped").exists()


def test_a_symlink_the_workload_made_never_leads_the_runner_out_of_its_workspace(tmp_path):
    spaces = Workspaces(tmp_path / "workspaces")
    outside = tmp_path / "host"
    (outside / "secret").mkdir(parents=True)
    (outside / "secret" / "key").write_text("host-only\n")
    ws = spaces.create(5)
    (ws / "a").symlink_to(outside)  # /workspace/a → a host directory
    with pytest.raises(ValueError, match="leads out of the workspace"):
        spaces.host_path(5, "/workspace/a/secret")
    (ws / "checkpoint").symlink_to(outside / "secret")
    assert spaces.host_path(5, "/workspace/checkpoint") == ws / "checkpoint"
    assert spaces.usage(5) == 0  # a symlinked checkpoint is not followed either
    assert regular_files(ws / "checkpoint") == []


def test_an_upload_opens_only_regular_files_really_inside_the_workspace(tmp_path):
    ws, host = tmp_path / "ws", tmp_path / "host"
    (ws / "checkpoint").mkdir(parents=True)
    host.mkdir()
    (host / "shadow").write_text("host-only\n")
    (ws / "checkpoint" / "ok").write_text("mine\n")
    (ws / "checkpoint" / "link").symlink_to(host / "shadow")
    (ws / "dirlink").symlink_to(host)  # a directory swapped for a symlink
    with _open_inside(ws / "checkpoint" / "ok", ws) as f:
        assert f.read() == b"mine\n"
    assert _open_inside(ws / "checkpoint" / "link", ws) is None
    assert _open_inside(ws / "dirlink" / "shadow", ws) is None


def test_a_runtime_without_workspaces_fails_a_checkpoint_lease_before_it_starts():
    lines: list[str] = []
    sync = CheckpointSync(client=None, workspaces=None, log=lines.append)
    lease = RunnerLease.parse({"id": 9, "checkpoint": {"bucket": "b", "prefix": "9/",
                                                       "restore": False}})
    assert sync.restore(lease) == ("checkpoint restore failed: this runner's runtime gives "
                                   "no workspace (Docker only)")
    assert sync.restore(RunnerLease.parse({"id": 10})) is None  # no store: nothing to do


@pytest.mark.docker
def test_the_default_checkpoint_folder_is_there_when_the_workload_starts(
        agent, marketplace, test_image, s3_server, bucket, tmp_path):
    marketplace.add_lease(75, UUIDS, image=test_image, chain_id=75,
                          command=["sh", "-c", "echo 7 > /workspace/checkpoint/step.txt && "
                                   "echo wrote && sleep 300"],
                          checkpoint=_store(s3_server, bucket, 75, restore=False))
    _until(agent, marketplace, 75, "running")
    wait_for(lambda: "wrote" in agent.runtime.logs(75, 5))
    assert (tmp_path / "workspaces" / "lease-75" / "checkpoint" / "step.txt").read_text() \
        == "7\n"
    marketplace.leases[75]["status"] = "cancelled"
    agent.tick()
    agent.checkpoints.join(30)


def test_a_short_access_key_id_does_not_garble_the_messages():
    cfg = {"access_key_id": "k", "secret_access_key": "s3cr3t-value"}
    text = CheckpointSync._message(
        cfg, ValueError("nothing at /workspace/checkpoint: s3cr3t-value"))
    assert "/workspace/checkpoint" in text and "s3cr3t-value" not in text
    long_id = {"access_key_id": "AKIAEXAMPLE123456789", "secret_access_key": "x" * 40}
    assert "AKIAEXAMPLE123456789" not in CheckpointSync._message(
        long_id, ValueError("key AKIAEXAMPLE123456789 refused"))
