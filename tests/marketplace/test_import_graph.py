"""No import circle among the market's modules, and no lazy import hiding one (issue 11).

Reads the source (ast): an edge a → b for every `import`/`from … import` of a
`marketplace.*` module at module level of marketplace/*.py. Run alone:
`python -m pytest tests/marketplace/test_import_graph.py`."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_graph import _cycle  # the one cycle finder

ROOT = Path(__file__).resolve().parents[2] / "marketplace"
# the market services (issue 11 item 1): nothing of the project imported inside a function
SERVICES = ("auctions", "book", "health", "lease_end", "leases", "locking", "matching",
            "ports", "preemption", "states", "tasks")


def _targets(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "marketplace":
            return [f"marketplace.{a.name}" for a in node.names]
        return [node.module]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = {f"marketplace.{p.stem}": p for p in ROOT.glob("*.py") if p.stem != "__init__"}
    modules |= {f"marketplace.api.{p.stem}": p for p in (ROOT / "api").glob("*.py")
                if p.stem != "__init__"}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    lazy = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            edges[name].update(t for t in _targets(node, name) if t in modules)
        if name.removeprefix("marketplace.") in SERVICES:
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for inner in ast.walk(node):
                        for t in _targets(inner, name):
                            if t.split(".")[0] in ("marketplace", "settlement", "providers"):
                                lazy.append(f"{name}.{node.name} imports {t}")
    return edges, lazy


def test_no_import_circle_among_marketplace_modules():
    edges, _ = _graph()
    assert edges["marketplace.book"] >= {"marketplace.locking", "marketplace.matching"}
    assert _cycle(edges) is None, " → ".join(_cycle(edges))


def test_no_lazy_imports_in_the_market_services():
    _, lazy = _graph()
    assert lazy == []
