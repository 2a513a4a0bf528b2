"""The committed contract artifacts are what the pinned npm solc makes of the sources."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_or_skip

CONTRACTS = ROOT / "contracts"
BUILD = CONTRACTS / "build"
ARTIFACTS = ["Settlement", "MockUSD", "FeeOnTransferUSD", "ReentrantUSD", "Mock18"]


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        require_or_skip("node is not installed: cannot recompile the contracts")
    if not (CONTRACTS / "node_modules" / "solc" / "package.json").exists():
        require_or_skip("contracts/node_modules missing: run `npm ci --prefix contracts`")
    return node


def test_recompiling_gives_the_committed_bytecode(node, tmp_path: Path):
    out = subprocess.run([node, str(CONTRACTS / "compile.js"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    for name in ARTIFACTS:
        fresh = json.loads((tmp_path / f"{name}.json").read_text())
        committed = json.loads((BUILD / f"{name}.json").read_text())
        assert fresh["bytecode"] == committed["bytecode"], f"{name}: run `npm run build`"
        assert fresh["deployedBytecode"] == committed["deployedBytecode"], name
        assert fresh["abi"] == committed["abi"], name


def test_compile_check_mode_passes(node):
    out = subprocess.run([node, str(CONTRACTS / "compile.js"), "--check"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "artifacts match" in out.stdout


def test_artifacts_record_the_pinned_compiler_and_settings():
    package = json.loads((CONTRACTS / "package.json").read_text())
    pinned = package["devDependencies"]["solc"]
    lock = json.loads((CONTRACTS / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/solc"]["version"] == pinned
    for dep in ("solc", "hardhat"):
        assert package["devDependencies"][dep][0].isdigit(), f"{dep} must be pinned exactly"
    assert package["dependencies"]["@openzeppelin/contracts"].startswith("5.")
    for name in ARTIFACTS:
        art = json.loads((BUILD / f"{name}.json").read_text())
        assert art["compiler"]["version"].startswith(pinned + "+")
        assert art["compiler"]["settings"]["evmVersion"] == "cancun"
        assert art["compiler"]["settings"]["optimizer"] == {"enabled": True, "runs": 200}
        assert art["bytecode"].startswith("0x6") and len(art["bytecode"]) > 100 and art["abi"]
