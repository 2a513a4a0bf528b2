"""The runner's memory budget (bench/README.md "Runner memory"): boto3/botocore (~20 MB
resident) load only when a lease has a checkpoint store, prometheus_client only with
--metrics-port, Django never. Checked in a fresh interpreter, as the runner starts."""

import json
import subprocess
import sys

HEAVY = ("boto3", "botocore", "prometheus_client", "django")


def test_the_runner_serving_leases_loads_no_heavy_library_until_asked():
    code = ("import json, sys; import providers.runner.cli, providers.runner.agent, "
            "providers.runner.checkpoint, providers.runner.lease; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == []



def test_the_docker_runtime_loads_the_sdk_without_its_ssh_transport():
    """paramiko (a test dependency here) would cost ~18 MB with invoke and cryptography."""
    code = ("import json, sys; from providers.runner.runtime_common import docker_sdk; "
            "docker = docker_sdk(); import paramiko; "
            "print(json.dumps([hasattr(docker, 'from_env'), "
            "'docker.transport.sshconn' in sys.modules, 'paramiko' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == [True, False, True]  # paramiko still importable after
