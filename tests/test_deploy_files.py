"""deploy/: the systemd units (systemd-analyze verify in a root of their own, and their
keys read back), the PgBouncer, Redis and nginx settings, the Celery queues per task
kind, and the two Dockerfiles built from the local base image with no registry (the
marketplace image passes `check --deploy` and answers /api/v1/)."""

from __future__ import annotations

import configparser
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_or_skip
from tests.support.net import free_port
from tests.support.processes import child_env

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def test_the_units_have_the_keys_each_part_needs():
    runner = _unit("gpumarket-runner.service")["Service"]
    assert runner["Restart"] == "on-failure"
    assert runner["RestartPreventExitStatus"] == "3"  # token refused (providers/runner)
    assert "gpumarket-runner run" in runner["ExecStart"]
    web = _unit("gpumarket-web@.service")["Service"]
    assert "uvicorn marketplace.asgi:application" in web["ExecStart"]
    assert "--port %i" in web["ExecStart"]
    worker = _unit("gpumarket-worker@.service")["Service"]
    assert "worker -Q %i" in worker["ExecStart"]
    beat = _unit("gpumarket-beat.service")["Service"]
    assert "celery -A marketplace beat" in beat["ExecStart"]
    for name in ("gpumarket-web@.service", "gpumarket-worker@.service"):
        assert " -B" not in _unit(name)["Service"]["ExecStart"]  # beat runs once, alone
        assert " --beat" not in _unit(name)["Service"]["ExecStart"]
    for name in ("gpumarket-web@.service", "gpumarket-worker@.service",
                 "gpumarket-beat.service"):
        unit = _unit(name)
        assert unit["Service"]["EnvironmentFile"] == "/etc/gpumarket/gpumarket.env"
        assert "gpumarket-metrics-dir.service" in unit["Unit"]["Requires"]
    wipe = (UNITS / "gpumarket-metrics-dir.service").read_text()  # two ExecStart= lines
    assert "\nExecStart=/bin/rm -rf /run/gpumarket/prometheus\n" in wipe
    env = (UNITS / "gpumarket.env").read_text()
    assert "PROMETHEUS_MULTIPROC_DIR=/run/gpumarket/prometheus" in env
    assert "GPUMARKET_DB_PGBOUNCER=1" in env


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *units],
                          capture_output=True, text=True, timeout=120)


def _unit_root(tmp_path: Path) -> Path:
    """A root where the units' commands exist (stubs) and systemd's own units are."""
    root = tmp_path / "root"
    for directory in ("opt/gpumarket/.venv/bin", "etc/systemd/system", "bin", "usr/bin",
                      "usr/lib/systemd"):
        (root / directory).mkdir(parents=True)
    for command in ("uvicorn", "celery", "gpumarket-runner"):
        stub = root / "opt/gpumarket/.venv/bin" / command
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    shutil.copy("/bin/rm", root / "bin/rm")
    shutil.copy("/usr/bin/install", root / "usr/bin/install")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for unit in UNITS.glob("*.service"):
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    shutil.copy(UNITS / "gpumarket.target", root / "etc/systemd/system")
    return root


INSTANCES = ["gpumarket-web@8001.service", "gpumarket-worker@market.service",
             "gpumarket-beat.service", "gpumarket-runner.service",
             "gpumarket-metrics-dir.service", "gpumarket.target"]


def test_systemd_analyze_verifies_the_units(tmp_path):
    """Where systemd-analyze is absent the keys test above is the check (nothing skips)."""
    if shutil.which("systemd-analyze") is None:
        test_the_units_have_the_keys_each_part_needs()
        return
    root = _unit_root(tmp_path)
    done = _verify(root, *INSTANCES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == ""
    # and it would catch a broken one: a command that is not there
    (root / "opt/gpumarket/.venv/bin/celery").unlink()
    broken = _verify(root, "gpumarket-beat.service")
    assert broken.returncode != 0
    assert "celery is not executable" in broken.stdout + broken.stderr


def test_pgbouncer_settings_are_transaction_mode_and_start():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(DEPLOY / "pgbouncer/pgbouncer.ini")
    assert ini["pgbouncer"]["pool_mode"] == "transaction"
    assert ini["pgbouncer"]["server_reset_query"] == ""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        require_or_skip("pgbouncer is not installed (apt-get install pgbouncer)")
    # the file as shipped, pointed at files of this test: pgbouncer accepts every key
    # (in a directory the postgres user can reach: pytest's tmp_path is root's only)
    tmp_path = Path(tempfile.mkdtemp(prefix="gpumarket-pgbouncer-ini-"))
    ini["pgbouncer"].update(listen_port=str(free_port()), unix_socket_dir="",
                            logfile=str(tmp_path / "log"), pidfile=str(tmp_path / "pid"),
                            auth_file=str(tmp_path / "users"), listen_addr="127.0.0.1")
    (tmp_path / "users").write_text('"gpumarket" "x"\n')
    with open(tmp_path / "pgbouncer.ini", "w") as f:
        ini.write(f)
    as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
    for path in (tmp_path, *tmp_path.iterdir()):
        shutil.chown(path, "postgres")
    proc = subprocess.Popen([*as_user, binary, str(tmp_path / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "process up" not in _read(tmp_path / "log"):
            assert proc.poll() is None, _read(tmp_path / "log")
            time.sleep(0.1)
        log = _read(tmp_path / "log")
        assert "process up" in log, log
        assert "unknown parameter" not in log.lower() and "syntax error" not in log.lower()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_redis_settings_are_accepted_and_never_evict(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", str(DEPLOY / "redis/redis.conf"), "--bind", "127.0.0.1",
         "--port", str(port), "--dir", str(tmp_path), "--appendonly", "no",
         "--requirepass", "test-only", "--daemonize", "no"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port, password="test-only")
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.1)
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_proxy_upgrades_websockets():
    conf = (DEPLOY / "nginx/gpumarket.conf").read_text()
    ws = conf.split("location /ws/", 1)[1].split("}", 1)[0]
    assert "proxy_set_header Upgrade $http_upgrade;" in ws
    assert "proxy_set_header Connection $connection_upgrade;" in ws
    assert "proxy_http_version 1.1;" in ws


def test_celery_queues_per_task_kind_route_every_task():
    code = ("import django; django.setup(); from marketplace.celery import app; "
            "import json; app.loader.import_default_modules(); "
            "print(json.dumps({n: app.amqp.router.route({}, n)['queue'].name "
            "for n in sorted(app.tasks) if not n.startswith('celery.')}))")

    def routes(flag: str) -> dict:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                             capture_output=True, env=child_env(GPUMARKET_CELERY_QUEUES=flag))
        return json.loads(out.stdout.strip().splitlines()[-1])

    on = routes("1")
    assert on["marketplace.tasks.close_auction"] == "market"
    assert on["marketplace.tasks.meter_running_leases"] == "leases"
    assert on["settlement.tasks.ledger_check"] == "ledger"
    assert set(on.values()) == {"market", "leases", "ledger"}  # no task left on `celery`
    assert set(routes("0").values()) == {"celery"}


def _docker(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.docker
def test_the_images_build_from_the_local_base_and_the_marketplace_answers(docker_client):
    base = subprocess.run([str(ROOT / "scripts/build-python-base-image.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900,
                          env={**child_env(), "PYTHON": sys.executable})
    assert base.returncode == 0, base.stdout + base.stderr
    tags = {"marketplace": "gpumarket/marketplace:test", "runner": "gpumarket/runner:test"}
    for name, tag in tags.items():
        built = _docker("build", "-q", "--network", "none", "-f",
                        str(DEPLOY / f"docker/{name}.Dockerfile"), "-t", tag, str(ROOT))
        assert built.returncode == 0, built.stdout + built.stderr
    from cryptography.fernet import Fernet

    env = ["-e", "DEBUG=0", "-e", "SECRET_KEY=" + "k" * 20 + Fernet.generate_key().decode(),
           "-e", "GPUMARKET_SECRETS_KEY=" + Fernet.generate_key().decode(),
           "-e", "ALLOWED_HOSTS=market.test"]
    check = _docker("run", "--rm", "--network", "none", *env, tags["marketplace"],
                    "python", "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert check.returncode == 0, check.stdout + check.stderr
    env += ["-e", "GPUMARKET_SSL_REDIRECT=0"]  # plain http inside the test's container
    name = f"gpumarket-image-test-{free_port()}"
    started = _docker("run", "-d", "--name", name, "--network", "none", *env,
                      tags["marketplace"])
    assert started.returncode == 0, started.stderr
    try:
        # its own database (SQLite in the image's var dir), migrated by the image's manage.py
        migrated = _docker("exec", name, "python", "manage.py", "migrate", "-v", "0")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        ask = ("import urllib.request as u; r = u.urlopen(u.Request("
               "'http://127.0.0.1:8000/api/v1/gpu-classes/', headers={'Host': 'market.test'}), "
               "timeout=5); print(r.status, r.read().decode())")
        deadline = time.monotonic() + 60
        while True:
            answer = _docker("exec", name, "python", "-c", ask, timeout=30)
            if answer.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert answer.returncode == 0, answer.stderr + _docker("logs", name).stderr
        status, body = answer.stdout.split(" ", 1)
        assert status == "200"
        assert "h100-sxm-80gb" in body  # the catalogue, read from the image's database
        json.loads(body)
    finally:
        _docker("rm", "-f", name)
    try:
        version = _docker("run", "--rm", "--network", "none", tags["runner"], "--version")
        assert version.returncode == 0
        assert version.stdout.startswith("gpumarket-runner ")
    finally:  # the test's own images go; the local base stays, a cache for the next build
        _docker("rmi", "-f", *tags.values())
