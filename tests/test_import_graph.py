"""The project's import graph (issue 11): no circle among the modules of `core`,
`marketplace`, `settlement`, `providers` and `frontend` (module-level imports), and the
directions of docs/ARCHITECTURE.md / DESIGN.md: `settlement` imports neither the market
nor the pages, `providers` not the pages, `core`, `marketplace/engine` and
`providers/runner` and the buyer CLI `buyer_cli` nothing of the project outside themselves
(at any level), and the runner and the CLI no Django either. `webhooks.events` (the
`emit` that settlement calls too) imports nothing of the project outside its app.

Reads the source with ast; run alone: `python -m pytest tests/test_import_graph.py`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "marketplace", "settlement", "providers", "webhooks", "alerts", "frontend",
            "buyer_cli")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        return [base, *(f"{base}.{a.name}" for a in node.names)]
    return []


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _graph(*, top_level_only: bool) -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        if top_level_only:  # `if TYPE_CHECKING:` blocks import nothing at run time
            nodes = [n for n in nodes if not (isinstance(n, ast.If)
                                              and "TYPE_CHECKING" in ast.unparse(n.test))]
        for node in nodes:
            for target in _imported(node, name, path.name == "__init__.py"):
                found = _resolve(target, modules)
                if found and found != name:
                    edges[name].add(found)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_circle_among_the_projects_modules():
    cycle = _cycle(_graph(top_level_only=True))
    assert cycle is None, " → ".join(cycle)


# (who, what it must not import); a package's own modules are always allowed
FORBIDDEN = [
    ("settlement", ("marketplace", "frontend", "providers")),
    ("providers", ("frontend", "marketplace")),
    ("core", ("marketplace", "settlement", "providers", "frontend")),
    ("marketplace.engine", ("core", "marketplace", "settlement", "providers", "frontend")),
    ("providers.runner", ("core", "marketplace", "settlement", "providers", "frontend")),
    ("buyer_cli", ("core", "marketplace", "settlement", "providers", "frontend")),
    # what the market's and settlement's services call (webhooks.emit): this app alone
    ("webhooks.events", ("core", "marketplace", "settlement", "providers", "frontend")),
    ("webhooks.models", ("core", "marketplace", "settlement", "providers", "frontend")),
    ("webhooks", ("frontend", "settlement", "providers", "alerts")),
    ("alerts.rules", ("core", "marketplace", "settlement", "providers", "frontend",
                      "webhooks")),  # the parser: plain Python
]
NO_DJANGO = ("providers.runner", "buyer_cli")  # programs on other machines: HTTP only


def test_imports_follow_the_designs_directions():
    edges = _graph(top_level_only=False)
    wrong = []
    for who, banned in FORBIDDEN:
        for module, targets in edges.items():
            if not _is_within(module, who):
                continue
            for target in targets:
                if _is_within(target, who):
                    continue
                if any(_is_within(target, b) for b in banned):
                    wrong.append(f"{module} imports {target}")
    assert wrong == [], wrong


def test_the_runner_and_the_cli_import_no_django():
    wrong = []
    for name, path in _modules().items():
        if not any(_is_within(name, who) for who in NO_DJANGO):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, name, path.name == "__init__.py"):
                if _is_within(target, "django") or _is_within(target, "rest_framework"):
                    wrong.append(f"{name} imports {target}")
    assert wrong == [], wrong
