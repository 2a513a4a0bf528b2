"""The shipped Prometheus files (deploy/prometheus/, deploy/grafana/) checked by Debian's
promtool: the rules load, their recorded-series tests pass, the config example is valid,
and every metric name the rules and the dashboard use is one gpumarket exports (or the
webhooks work's gpumarket_webhook_deliveries_total, named in docs/METRICS.md).
The metrics settings refuse a bad allowlist by name."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, require_or_skip

PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "gpumarket.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpumarket.json"
SOURCES = [ROOT / "core" / "metrics.py", ROOT / "marketplace" / "metrics_view.py",
           ROOT / "providers" / "runner" / "metrics.py"]
NAME = re.compile(r"\b((?:gpumarket|celery)_[a-z_]+|DCGM_FI_[A-Z_]+)\b")
SUFFIXES = ("_bucket", "_count", "_sum")


def promtool(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    if not shutil.which("promtool"):
        require_or_skip("Debian's prometheus package (promtool) is not installed (.ci/run)")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_promtool_checks_the_rules():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_runs_the_rules_recorded_series_tests():
    done = promtool("test", "rules", "gpumarket.rules.test.yml", cwd=PROM / "rules")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_checks_the_config_example(tmp_path):
    """The example names /etc/prometheus/… for the token: a copy points it at a file here."""
    token = tmp_path / "gpumarket-metrics.token"
    token.write_text("x")
    (tmp_path / "rules").mkdir()
    shutil.copy(RULES, tmp_path / "rules" / RULES.name)
    config = (PROM / "prometheus.yml").read_text()
    assert "/etc/prometheus/gpumarket-metrics.token" in config
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/gpumarket-metrics.token", str(token)))
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 17 rules found" in done.stdout


def _exported() -> set[str]:
    names = set()
    for path in SOURCES:
        names |= set(NAME.findall(path.read_text()))
    return names


@pytest.mark.parametrize("path", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_the_rules_and_the_dashboard_use_only_exported_names(path):
    exported = _exported()
    used = set(NAME.findall(path.read_text()))
    assert used, path
    unknown = {n for n in used if n not in exported
               and not (n.endswith(SUFFIXES) and n.rsplit("_", 1)[0] in exported)}
    assert unknown == set()


def test_a_bad_metrics_allowlist_stops_the_start_naming_it(tmp_path):
    env = {**os.environ, "GPUMARKET_METRICS_ALLOW": "10.0.0.0/8,not-a-network",
           "GPUMARKET_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "marketplace.settings"}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "GPUMARKET_METRICS_ALLOW" in done.stderr and "not-a-network" in done.stderr


def test_the_scrape_config_reaches_the_web_hosts_not_the_public_proxy():
    """deploy/nginx answers /metrics with 404 and the web processes listen on 127.0.0.1
    (deploy/systemd): the example scrapes each host's own port, never the proxy's name."""
    config = (PROM / "prometheus.yml").read_text()
    nginx = (ROOT / "deploy" / "nginx" / "gpumarket.conf").read_text()
    proxy_names = set(re.findall(r"server_name\s+([^;\s]+)", nginx))
    job = config.split("job_name: gpumarket\n", 1)[1].split("job_name:", 1)[0]
    targets = re.findall(r'"([^"]+:\d+)"', job)
    assert targets and all(t.split(":")[0] not in proxy_names for t in targets), targets
    assert re.search(r"location /metrics \{[^}]*return 404", nginx)
    web_unit = (ROOT / "deploy" / "systemd" / "gpumarket-web@.service").read_text()
    assert "--host 127.0.0.1" in web_unit and all(t.startswith("127.0.0.1:") for t in targets)
