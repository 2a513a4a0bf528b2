"""Clear one-line errors for the mistakes a newcomer makes with the runner CLI."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import ROOT

from .runner_helpers import H100


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "providers.runner", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, **kw)


def test_url_without_scheme_is_named_invalid(tmp_path):
    r = _cli("register", "--url", "127.0.0.1:8123", "--token", "gmr_x", "--simulate", str(H100),
             "--state-dir", str(tmp_path))
    assert r.returncode == 1
    assert "invalid --url '127.0.0.1:8123': it must start with http:// or https://" in r.stderr


def test_missing_dump_file_is_not_called_malformed(tmp_path):
    r = _cli("inventory", "--simulate", str(tmp_path / "nope.txt"))
    assert r.returncode == 2
    assert "cannot read the nvidia-smi dump" in r.stderr and "malformed" not in r.stderr


def test_missing_url_and_token_grammar(tmp_path):
    r = _cli("run", "--state-dir", str(tmp_path), env={"PATH": "/usr/bin:/bin",
                                                       "HOME": str(tmp_path)})
    assert r.returncode == 1
    assert "missing --url and --token: pass them on the command line" in r.stderr


def test_register_with_an_unknown_token_says_so(marketplace, tmp_path):
    marketplace.token = "gmr_the_right_one"
    r = _cli("register", "--url", marketplace.url, "--token", "gmr_wrong", "--simulate",
             str(H100), "--state-dir", str(tmp_path))
    assert r.returncode == 3
    assert "does not know this runner token (401)" in r.stderr
    assert "gmr_wrong" not in r.stderr + r.stdout


def test_a_second_run_on_the_same_state_dir_is_refused(marketplace, tmp_path):
    assert _cli("register", "--url", marketplace.url, "--token", marketplace.token,
                "--simulate", str(H100), "--state-dir", str(tmp_path)).returncode == 0
    first = subprocess.Popen([sys.executable, "-m", "providers.runner", "run", "--state-dir",
                              str(tmp_path), "--runtime", "process", "--poll-interval", "0.2"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "run.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        second = _cli("run", "--state-dir", str(tmp_path), "--runtime", "process")
        assert second.returncode == 1
        assert f"another `gpumarket-runner run` (pid {first.pid}) is using" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=20)
