"""The README's runner examples work next to the running demo: the dumps it tells a
newcomer to `--simulate` exist and are not among those `make demo` registers (a GPU UUID
belongs to one node per marketplace: the trial got "GPU … is registered to another node")."""

from __future__ import annotations

import re

from marketplace.demo import HOSTS

from .runner_helpers import ROOT


def _runner_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("gpumarket-runner doctor")
    return text[start:text.index("\n## ", start)]


def test_the_readme_simulates_dumps_the_demo_does_not_register():
    section = _runner_section()
    named = re.findall(r"--simulate (data/nvidia-smi/[\w.-]+)", section)
    assert named, section
    demo = {path.resolve() for path in HOSTS.values()}
    for path in named:
        assert (ROOT / path).is_file(), path
        assert (ROOT / path).resolve() not in demo, f"{path} is registered by make demo"
    assert "registered to another node" in section  # the clash is explained
    assert "fresh marketplace" in section
