"""The runner's /metrics (providers/runner/metrics.py): the recorded H100 host's GPUs under
dcgm-exporter's names and labels, served over real HTTP on 127.0.0.1 and read back with
prometheus_client's parser. The GPUs come from the recorded dump (no GPU here)."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.config import CliError
from providers.runner.metrics_server import serve_metrics
from providers.runner.nvml import DumpGpus
from providers.runner.nvsmi import load_dump
from providers.runner.nvsmi_health import health_from_tree
from tests.support.net import free_port

from .runner_helpers import H100, ROOT, TOKEN

GPU0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"  # bus 00000000:53:00.0 in the H100 dump
XID_LOG = ROOT / "data" / "dmesg-with-xid-119.log"


@pytest.fixture
def agent():
    client = MarketplaceClient("http://127.0.0.1:9", TOKEN, timeout=1)  # never called
    yield Agent(client, DumpGpus(H100), runtime=None, log=lambda _line: None)
    client.close()


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_dcgm_names_labels_and_the_recorded_values(agent):
    agent._lease_gpus = {31: [GPU0]}  # as the last lease list had it
    port = free_port()
    server = serve_metrics(agent, port, "127.0.0.1")
    try:
        families = scrape(port)
    finally:
        server.shutdown()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
                 "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):
            assert len(families[name]) == 8, name  # one series per GPU of the host
    first = next(s for s in families["DCGM_FI_DEV_GPU_TEMP"] if s.labels["UUID"] == GPU0)
    assert first.labels == {"gpu": "0", "UUID": GPU0, "device": "nvidia0",
                            "pci_bus_id": "00000000:53:00.0",
                            "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": socket.gethostname(), "lease": "31"}
    _inv, tree = load_dump(H100)
    recorded = health_from_tree(tree)[GPU0]
    by_name = {name: next(s.value for s in samples if s.labels["UUID"] == GPU0)
               for name, samples in families.items()}
    assert by_name["DCGM_FI_DEV_GPU_TEMP"] == recorded["temperature_c"]
    assert by_name["DCGM_FI_DEV_POWER_USAGE"] == recorded["power_w"]
    assert (by_name["DCGM_FI_DEV_FB_USED"], by_name["DCGM_FI_DEV_FB_FREE"]) == (0, 81007)
    assert (by_name["DCGM_FI_DEV_SM_CLOCK"], by_name["DCGM_FI_DEV_MEM_CLOCK"]) == (345, 2619)
    assert by_name["DCGM_FI_DEV_XID_ERRORS"] == 0
    idle = [s for s in families["DCGM_FI_DEV_GPU_UTIL"] if s.labels["UUID"] != GPU0]
    assert {s.labels["lease"] for s in idle} == {""}


def test_the_last_xid_the_agent_saw_is_exported_on_its_gpu(agent, tmp_path):
    log = tmp_path / "kern.log"  # the real XID 119 lines, moved to GPU0's bus 53
    log.write_text(XID_LOG.read_text().replace("PCI:0000:9b:00", "PCI:0000:53:00"))
    agent.gpus.replay_xid(log)
    agent.evaluate_health()
    port = free_port()
    server = serve_metrics(agent, port, "127.0.0.1")
    try:
        xids = {s.labels["UUID"]: s.value for s in scrape(port)["DCGM_FI_DEV_XID_ERRORS"]}
    finally:
        server.shutdown()
    assert xids[GPU0] == 119
    assert sum(xids.values()) == 119  # the other GPUs: none


def test_metrics_port_off_by_default_and_bad_ports_refused(agent):
    assert serve_metrics(agent, None, "127.0.0.1") is None
    with pytest.raises(CliError, match="1 to 65535"):
        serve_metrics(agent, 70000, "127.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CliError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve_metrics(agent, port, "127.0.0.1")
