"""Every numeric value `gpumarket-runner run` takes (flags, GPUMARKET_RUNNER_* variables,
config.json "limits") is checked: negative, zero where that means nothing, NaN, infinity,
JSON true, absurdly large values are refused with one line naming the flag, variable or key
(the trial found `--grace -1` accepted while `--poll-interval -1` was refused)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from providers.runner.cli import CliError, build_parser, resource_policy
from providers.runner.limits import ResourcePolicy, parse_size

from .runner_helpers import ROOT


def _parse(*flags: str):
    return build_parser().parse_args(["run", *flags])


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--grace", "-1", "must be >= 0"),
    ("--grace", "nan", "is not a finite number"),
    ("--grace", "inf", "is not a finite number"),
    ("--poll-interval", "-1", "must be > 0"),
    ("--poll-interval", "0", "must be > 0"),
    ("--poll-interval", "NaN", "is not a finite number"),
    ("--poll-interval", "1e400", "is not a finite number"),
    ("--poll-interval", "1e12", "must be at most 31536000"),
    ("--heartbeat-interval", "0", "must be > 0"),
    ("--heartbeat-interval", "-inf", "is not a finite number"),
    ("--logs-interval", "-0.5", "must be > 0"),
    ("--logs-interval", "soon", "is not a number"),
    ("--benchmark-interval", "-1", "must be >= 0"),
    ("--benchmark-interval", "nan", "is not a finite number"),
    ("--process-uids", "60100", "is not FIRST-LAST"),
    ("--process-uids", "a-b", "is not FIRST-LAST"),
    ("--process-uids", "0-10", "must be FIRST-LAST with 1000 <= FIRST"),
    ("--process-uids", "61000-60000", "must be FIRST-LAST with 1000 <= FIRST"),
    ("--pull-stall-timeout", "0.5", "must be from 1 to 604800 seconds"),
    ("--pull-stall-timeout", "0", "must be > 0"),
    ("--pull-timeout", "1e6", "must be from 1 to 604800 seconds"),
])
def test_a_bad_number_is_refused_naming_the_flag(flag, value, why):
    done = subprocess.run([sys.executable, "-m", "providers.runner", "run", f"{flag}={value}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"gpumarket-runner run: argument {flag}: '{value}' {why}"), line


def test_zero_is_meaningful_for_grace_and_benchmark_interval():
    args = _parse("--grace", "0", "--benchmark-interval", "0", "--poll-interval", "0.1")
    assert (args.grace, args.benchmark_interval, args.poll_interval) == (0.0, 0.0, 0.1)
    assert _parse().grace == 10.0
    assert _parse("--process-uids", "70000-70009").process_uids == range(70000, 70010)
    assert (_parse().pull_stall_timeout, _parse().pull_timeout) == (300.0, 21600.0)
    assert _parse("--pull-stall-timeout", "30").pull_stall_timeout == 30.0


@pytest.mark.parametrize(("flags", "config", "env", "named"), [
    (("--cpus-per-gpu", "nan"), {}, {}, "--cpus-per-gpu: 'nan' is not a finite number"),
    (("--cpus-per-gpu", "inf"), {}, {}, "--cpus-per-gpu: 'inf' is not a finite number"),
    (("--cpus-per-gpu", "-2"), {}, {}, "--cpus-per-gpu: '-2' must be more than 0"),
    (("--pids-limit", "0"), {}, {}, "--pids-limit: '0' must be more than 0"),
    (("--pids-limit", "99999999999"), {}, {},
     "--pids-limit: '99999999999' must be at most 4194304"),
    (("--memory-per-gpu", "9" * 400), {}, {}, "is too large"),
    (("--shm-size=-1g",), {}, {}, "--shm-size: '-1g' is not a size"),
    ((), {}, {"GPUMARKET_RUNNER_CPUS_PER_GPU": "NaN"},
     "GPUMARKET_RUNNER_CPUS_PER_GPU: 'NaN' is not a finite number"),
    ((), {}, {"GPUMARKET_RUNNER_PIDS_LIMIT": "-5"},
     "GPUMARKET_RUNNER_PIDS_LIMIT: '-5' must be more than 0"),
    ((), {"limits": {"cpus_per_gpu": True}}, {},
     'config.json "limits.cpus_per_gpu": True is not a number'),
    ((), {"limits": {"pids_limit": False}}, {},
     'config.json "limits.pids_limit": False is not a number'),
    ((), {"limits": {"cpus_per_gpu": 0}}, {},
     'config.json "limits.cpus_per_gpu": 0 must be more than 0'),
    ((), {"limits": {"memory_per_gpu": -1}}, {},
     'config.json "limits.memory_per_gpu": -1 must be more than 0 bytes'),
])
def test_a_bad_limit_from_any_source_is_refused(flags, config, env, named):
    with pytest.raises(CliError) as error:
        resource_policy(_parse(*flags), config, env)
    assert named in str(error.value)


def test_the_policy_itself_refuses_what_the_cli_would():
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match="finite number more than 0"):
            ResourcePolicy(cpus_per_gpu=bad)
    with pytest.raises(ValueError, match="too large"):
        parse_size("1" + "0" * 400 + "t")
