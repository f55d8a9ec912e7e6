"""The architecture holds (../shared/DESIGN.md): imports point down the layers and no two
first-party modules need each other. Read from the source with `ast`, so an import inside a
function counts as much as one at the top."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvpd", "simulator", "realexec", "workloads")

# what each part may import (first-party prefixes); a module may always import its own part
ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    ("workloads", ()),
    ("simulator.core", ()),
    ("simulator.scenario", ("simulator.cost", "simulator.engines", "simulator.yaml_file",
                            "simulator.validation_errors", "simulator.defaults", "workloads")),
    ("simulator.scenario_trace", ("workloads",)),
    ("simulator.engines", ("simulator.cost", "simulator.defaults", "simulator.scenario_trace")),
    ("simulator.defaults", ()),
    ("simulator.yaml_file", ()),
    ("simulator.validation_errors", ()),
    ("simulator.cost", ("simulator.core",)),
    ("simulator.calibrate", ("simulator.core", "simulator.cost", "simulator.validation_errors")),
    ("simulator.cluster", ("simulator.core", "simulator.cost", "simulator.calibrate",
                           "simulator.scenario")),
    ("simulator.distribution", ()),
    ("simulator.progress", ()),
    ("simulator.metrics", ("simulator.core", "simulator.distribution")),
    ("simulator.preflight", ("simulator.scenario", "simulator.cluster", "simulator.cost",
                             "workloads")),
    ("simulator.run", ("simulator.core", "simulator.cost", "simulator.cluster", "simulator.scenario",
                       "simulator.scenario_trace",
                       "simulator.metrics", "simulator.plots", "simulator.simulation",
                       "simulator.multiproc", "simulator.progress", "workloads")),
    ("simulator.plan", ("simulator.", "workloads")),
    ("simulator", ("simulator.", "workloads")),
    ("realexec.engine", ("simulator.core", "simulator.metrics")),
    ("realexec.serving", ("realexec.engine", "simulator.", "workloads")),
    ("realexec.fidelity", ("realexec.engine", "realexec.serving", "simulator.", "workloads")),
    ("realexec", ("realexec.", "simulator.core")),
    ("kvpd", ("kvpd.", "realexec", "simulator", "workloads")),
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports."""
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from pkg import mod` runs pkg/__init__ as well: an edge to both
                targets = [base] + [f"{base}.{a.name}" for a in node.names
                                    if f"{base}.{a.name}" in files]
            for t in targets:
                r = resolve(t)
                if r and r != mod and r.split(".")[0] in PACKAGES:
                    edges[mod].add(r)
    return edges


def _rule(mod: str) -> tuple[str, tuple[str, ...]]:
    return next((part, ok) for part, ok in ALLOWED if mod == part or mod.startswith(part + "."))


def test_imports_point_down_the_layers():
    wrong = []
    for mod, targets in graph().items():
        part, ok = _rule(mod)
        for t in targets:
            if t == part or t.startswith(part + "."):
                continue
            if t.startswith("simulator.core") and part.startswith("simulator"):
                continue  # every simulator part may use the core
            if not any(t == a or t.startswith(a if a.endswith(".") else a + ".") or t == a.rstrip(".")
                       for a in ok):
                wrong.append(f"{mod} -> {t}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_core_imports_neither_simpy_nor_torch():
    for path in (ROOT / "simulator" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert n.split(".")[0] not in ("simpy", "torch"), f"{path.name} imports {n}"


def test_the_checker_sees_a_violation():
    """The rules are not vacuous: a workloads -> simulator import would be flagged."""
    part, ok = _rule("workloads.trace")
    assert part == "workloads" and ok == ()
    assert _rule("simulator.cost.costmodel")[0] == "simulator.cost"
    assert "simulator.cost.breakdown" in graph()["simulator.cost.costmodel"]
