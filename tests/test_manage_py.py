"""`manage.py` with a configuration the settings refuse says so in one line (exit 1),
not with a 55-line traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_a_refused_setting_is_one_line_naming_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "SECRET_KEY_FILE")}
    env.update(DEBUG="0", GPUMARKET_VAR_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: the configuration is not usable: SECRET_KEY (or SECRET_KEY_FILE) is "
        "required when DEBUG is off"], done.stderr


def _check(tmp_path, **extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUMARKET_VAR_DIR=str(tmp_path), **extra)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_number_setting_that_does_not_parse_is_refused_naming_it(tmp_path):
    done = _check(tmp_path, GPUMARKET_TAKE_RATE_BPS="15%")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: the configuration is not usable: GPUMARKET_TAKE_RATE_BPS must be a "
        "whole number, not '15%'"], done.stderr
    done = _check(tmp_path, GPUMARKET_DB_POOL_TIMEOUT="nan")
    assert done.returncode == 1
    assert "GPUMARKET_DB_POOL_TIMEOUT must be a number, not 'nan'" in done.stderr


def test_a_yes_no_setting_that_is_neither_is_refused_not_read_as_no(tmp_path):
    done = _check(tmp_path, GPUMARKET_DEV_CREDIT="maybe")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: the configuration is not usable: GPUMARKET_DEV_CREDIT must be yes or no "
        "(1/0, true/false, on/off), not 'maybe'"], done.stderr
    assert _check(tmp_path, GPUMARKET_DEV_CREDIT="off").returncode == 0
    assert _check(tmp_path, GPUMARKET_DEV_CREDIT="Yes").returncode == 0
