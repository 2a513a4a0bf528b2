"""`gpumarket-runner status` says precisely why it lists no lease workload: the state dir
does not exist, the runner is not registered there, or no Docker Engine answers (the trial
saw "none found (no Docker Engine answers, or not registered)" while Docker answered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .runner_helpers import ROOT


def _status(state_dir, **env) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUMARKET_")}
    done = subprocess.run([sys.executable, "-m", "providers.runner", "status", "--state-dir",
                           str(state_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _leases(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("leases:")]


def test_a_missing_state_dir_is_named(tmp_path):
    missing = tmp_path / "nonexistent" / "x"
    lines = _status(missing)
    assert lines[0] == f"state dir:   {missing} (does not exist)"
    assert _leases(lines) == [
        f"leases:      none listed: the state dir does not exist (nothing registered there: "
        f"run `gpumarket-runner register --state-dir {missing}`, or pass the --state-dir "
        "that `register` used)"]
    assert not missing.exists()  # status creates nothing


def test_a_state_dir_without_registration_says_not_registered(tmp_path):
    [line] = _leases(_status(tmp_path))
    assert line == (f"leases:      none listed: not registered (no {tmp_path}/config.json: run "
                    f"`gpumarket-runner register --state-dir {tmp_path}`), so no container "
                    "can be told to be this node's")
    (tmp_path / "config.json").write_text(json.dumps({"url": "http://x", "node": {}}))
    [line] = _leases(_status(tmp_path))
    assert f"not registered ({tmp_path}/config.json names no node" in line


def test_no_docker_engine_is_named_with_where_it_was_asked(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"node": {"id": 7, "uid": "n-7"}}))
    sock = tmp_path / "no-docker.sock"
    [line] = _leases(_status(tmp_path, DOCKER_HOST=f"unix://{sock}"))
    assert line.startswith(f"leases:      none listed: no Docker Engine answers at "
                           f"unix://{sock} (")


def test_a_registered_node_with_docker_lists_its_containers(tmp_path, docker_client):
    (tmp_path / "config.json").write_text(json.dumps({"node": {"id": 7, "uid": "n-h7-x"}}))
    assert _leases(_status(tmp_path)) == [
        "leases:      0 workload(s) in the docker runtime (Docker containers of node n-h7-x)"]
