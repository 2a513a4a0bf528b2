"""One real scrape: Debian's `prometheus` scrapes the marketplace (uvicorn, bearer token)
and a runner (its own process, --simulate from the recorded H100 dump, --metrics-port),
loads the shipped rules, and answers queries over its HTTP API. A third job scrapes the
marketplace without the token: it must be refused (401), and nothing of it is stored.
Every query of the shipped Grafana dashboard must parse in that Prometheus."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest

from tests.conftest import ROOT, require_or_skip
from tests.factories import H100_DUMP, registered_node
from tests.support.net import free_port
from tests.support.servers import AsgiServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]
TOKEN = "metrics-e2e-token-0123456789abcdef"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:  # a query that does not parse: 400 with a body
        return json.loads(exc.read())


def results(base: str, expr: str) -> list[dict]:
    answer = query(base, expr)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def up(base: str, job: str) -> str | None:
    found = results(base, f'up{{job="{job}"}}')
    return found[0]["value"][1] if found else None


@pytest.fixture
def prometheus(tmp_path):
    if not shutil.which(PROMETHEUS):
        require_or_skip("Debian's prometheus package is not installed (.ci/run installs it)")
    procs = []

    def start(market_port: int, runner_port: int) -> str:
        (tmp_path / "token").write_text(TOKEN)
        (tmp_path / "token").chmod(0o600)
        rules = ROOT / "deploy" / "prometheus" / "rules" / "gpumarket.rules.yml"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "gpumarket", "authorization": {
                    "type": "Bearer", "credentials_file": str(tmp_path / "token")},
                 "static_configs": [{"targets": [f"127.0.0.1:{market_port}"]}]},
                {"job_name": "gpumarket-runner",
                 "static_configs": [{"targets": [f"127.0.0.1:{runner_port}"]}]},
                {"job_name": "gpumarket-no-token",
                 "static_configs": [{"targets": [f"127.0.0.1:{market_port}"]}]},
            ],
        }
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        check = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        port = free_port()
        log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115
        procs.append((subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT), log))
        base = f"http://127.0.0.1:{port}"
        wait_until("prometheus to answer", lambda: _ready(base), timeout=60)
        return base

    yield start
    for proc, log in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_prometheus_scrapes_the_marketplace_and_a_runner(settings, prometheus,
                                                         runner_factory):
    settings.GPUMARKET_METRICS_TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
    settings.GPUMARKET_METRICS_ALLOW = []
    _provider, node, token = registered_node(H100_DUMP, name="metrics-e2e")
    node.gpus.all().delete()  # the runner registers them itself
    runner_port = free_port()
    with AsgiServer() as server:
        runner = runner_factory(server.url, token, H100_DUMP)
        reg = runner.register()
        assert reg.returncode == 0, reg.stderr
        runner.start(extra=("--metrics-port", str(runner_port)))
        base = prometheus(server.port, runner_port)

        wait_until("both targets up", lambda: up(base, "gpumarket") == "1"
                   and up(base, "gpumarket-runner") == "1", timeout=90, every=0.5)
        wait_until("a heartbeat counted", lambda: results(
            base, 'gpumarket_heartbeats_total{job="gpumarket"} > 0'), timeout=60, every=0.5)
        gpus = wait_until("the runner's DCGM series", lambda: results(
            base, 'DCGM_FI_DEV_GPU_TEMP{job="gpumarket-runner"}'), timeout=30, every=0.5)
        assert len(gpus) == 8
        assert {g["metric"]["modelName"] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
        uuids = {g["metric"]["UUID"] for g in gpus}
        assert uuids == set(node.gpus.values_list("uuid", flat=True))
        healthy = results(base, 'gpumarket_gpus{job="gpumarket",health="healthy"}')
        assert sum(float(s["value"][1]) for s in healthy) == 8

        # bad input: the job without the token is refused, and stores nothing but `up`
        # (its first scrape may come after the other two jobs': wait for it to be recorded)
        wait_until("the token-less job scraped", lambda: up(base, "gpumarket-no-token")
                   is not None, timeout=30, every=0.5)
        assert up(base, "gpumarket-no-token") == "0"
        with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10) as answer:
            targets = json.loads(answer.read())["data"]["activeTargets"]
        [refused] = [t for t in targets if t["labels"]["job"] == "gpumarket-no-token"]
        assert "401" in refused["lastError"], refused
        assert results(base, '{job="gpumarket-no-token",__name__!~"up|scrape_.*"}') == []

        # the shipped rules loaded and evaluate; the dashboard's queries parse
        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as answer:
            groups = json.loads(answer.read())["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) >= 15 and {r["health"] for r in rules} <= {"ok", "unknown"}
        dashboard = json.loads((ROOT / "deploy" / "grafana" / "gpumarket.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$market", ".*").replace("$host", ".*")
                assert query(base, expr)["status"] == "success", (panel["title"], expr)
