"""The data plane stands alone: every ``workloads`` module imports without the control plane
(``orchestrator``) and without Ray, MLflow or Optuna, so a workload runs and is tested without them."""

import ast
import subprocess
import sys
from pathlib import Path

CONTROL_PLANE = ("orchestrator", "ray", "mlflow", "optuna")

PROBE = f"""
import importlib, pkgutil, sys
import workloads
names = [m.name for m in pkgutil.walk_packages(workloads.__path__, "workloads.")]
for name in names:
    importlib.import_module(name)
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({CONTROL_PLANE!r}))
print(len(names), ",".join(loaded))
"""


def test_every_workloads_module_imports_without_the_control_plane():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, loaded = proc.stdout.strip().split(" ", 1) if " " in proc.stdout.strip() else (proc.stdout.strip(), "")
    assert int(count) > 30  # every module was imported, not an empty package
    assert loaded == "", f"workloads imports {loaded}"


HEAVY = ("torch", "transformers", "ray", "mlflow", "optuna", "matplotlib")

CLI_PROBE = f"""
import importlib, pkgutil, sys
import orchestrator.cli
names = [m.name for m in pkgutil.iter_modules(orchestrator.cli.__path__) if m.name != "__main__"]
for name in names:
    importlib.import_module(f"orchestrator.cli.{{name}}")
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print(len(names), ",".join(loaded))
"""


def test_the_command_line_loads_no_heavy_library_until_a_command_runs():
    """Every command module imports without torch, Ray, MLflow, Optuna or matplotlib: a command
    loads them inside its ``run`` (the function-local imports ruff allows in ``orchestrator/cli``),
    so ``orchestrate --help``, ``status`` and a refused input answer at once."""
    proc = subprocess.run([sys.executable, "-c", CLI_PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, _, loaded = proc.stdout.strip().partition(" ")
    assert int(count) > 10
    assert loaded == "", f"orchestrator.cli imports {loaded}"


def _import_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, function-local imports included
    (a local import must not hide a cycle). ``from a import b`` names the module ``a.b`` when it
    is one, else ``a``."""
    root = Path(__file__).resolve().parents[1]
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for package in ("workloads", "orchestrator") for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module for a in node.names}
        graph[module] = {e for e in edges if e in files and e != module}
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more nodes: each is a cycle (or a knot of them)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(graph) | {n for targets in graph.values() for n in targets})

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in nodes:
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_import_cycle_even_through_function_local_imports():
    graph = _import_graph()
    assert len(graph) > 60
    cycles = _strongly_connected(graph)
    assert cycles == [], f"import cycles: {cycles}"


# Modules that stand as their own node: the contract the sub-packages of their package implement,
# importing nothing of that package. ``workloads.kinds.protocol`` is what every kind's ``kind.py``
# declares; the registry beside it (``workloads.kinds.registry``) imports every kind. Importing the
# protocol runs ``workloads/kinds/__init__.py`` first (the registry, so the kinds), which is sound as
# long as a kind imports the protocol alone, never the registry, the lifecycle or the package's face:
# such an import still makes a cycle here. (It was a package of its own, so a node, before issue 54.)
CONTRACTS = {"workloads.kinds.protocol"}


def _package_of(module: str, packages: set[str]) -> str:
    """The package a module belongs to: a package's ``__init__`` is the package; a module, the
    directory it is in; a loose module at the top (``workloads.spec``) and a contract
    (:data:`CONTRACTS`) stand as their own node. Importing ``a.b.m`` runs ``a/b/__init__.py``
    first, so ``a.b``'s modules and its ``__init__`` (a registry, say) are one node."""
    if module in packages or module in CONTRACTS:
        return module
    parent = module.rpartition(".")[0]
    return parent if "." in parent else module


def _package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Package -> package it imports -> the module imports that make the edge."""
    packages = {m for m in graph if any(other.startswith(m + ".") for other in graph)} | {"workloads", "orchestrator"}
    edges: dict[str, dict[str, set[str]]] = {}
    for module, imported in graph.items():
        for target in imported:
            a, b = _package_of(module, packages), _package_of(target, packages)
            if a != b:
                edges.setdefault(a, {}).setdefault(b, set()).add(f"{module} -> {target}")
    return edges


# Package cycles that remain while the kinds and the lifecycle are being taken apart (issue 46). The list
# may only shrink: a cycle not in it fails, and so does an entry that no longer is one (remove it).
# Each entry is a set of packages; a cycle passes when all its packages lie in one entry.
KNOWN_PACKAGE_CYCLES: list[set[str]] = [
]


def test_no_package_cycle_beyond_the_known_ones():
    """No package imports, directly or through others, a package that imports it back: a layer is
    a package, and the data plane's shared packages (losses, training, data, retrieval) import no
    kind; the sweep does not import the report."""
    graph = _import_graph()
    for contract in CONTRACTS:  # a contract imports nothing of its package
        package = contract.rpartition(".")[0]
        assert not {m for m in graph[contract] if m == package or m.startswith(package + ".")}, contract
    edges = _package_graph(graph)
    nodes = set(edges) | {b for targets in edges.values() for b in targets}
    assert {"orchestrator.sweep", "orchestrator.report", "workloads.kinds.rerank", "workloads.losses"} <= nodes
    cycles = _strongly_connected({a: set(targets) for a, targets in edges.items()})
    unknown = [c for c in cycles if not any(set(c) <= known for known in KNOWN_PACKAGE_CYCLES)]
    detail = "\n".join(f"{a} -> {b}: {sorted(edges[a][b])[:3]}" for c in unknown for a in c for b in c if b in edges.get(a, {}))
    assert unknown == [], f"package cycles: {unknown}\n{detail}"
    stale = [sorted(known) for known in KNOWN_PACKAGE_CYCLES if not any(set(c) & known for c in cycles)]
    assert stale == [], f"no longer cycles, remove from KNOWN_PACKAGE_CYCLES: {stale}"


def test_the_package_graph_finds_a_cycle_between_packages():
    """The check itself: two packages whose modules import each other (no module cycle) are a cycle."""
    graph = {"workloads.a.x": {"workloads.b.y"}, "workloads.b.z": {"workloads.a.w"}, "workloads.a.w": set(),
             "workloads.b.y": set(), "workloads.a": set(), "workloads.b": set()}
    assert _strongly_connected(graph) == []
    edges = _package_graph(graph)
    assert _strongly_connected({a: set(t) for a, t in edges.items()}) == [["workloads.a", "workloads.b"]]


def _documented_layout(text: str) -> set[str]:
    """The paths the layout tree of docs/development.md lists: an entry's indent (two spaces a
    level) places it under the folder above it; a description's continuation line is not one."""
    block = text.split("## The layout", 1)[1].split("```", 2)[1]
    paths, stack = set(), []
    for line in block.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped or indent >= 20:  # (a description carried over to the next line)
            continue
        name = stripped.split()[0]
        stack = stack[: indent // 2] + [name.rstrip("/")]
        paths.add("/".join(stack))
    return paths


def test_the_documented_layout_is_the_tree():
    """docs/development.md's layout names only what exists, and every package of the two planes."""
    root = Path(__file__).resolve().parents[1]
    documented = _documented_layout((root / "docs" / "development.md").read_text(encoding="utf-8"))
    assert sorted(p for p in documented if not (root / p).exists()) == []
    packages = {p.parent.relative_to(root).as_posix() for plane in ("workloads", "orchestrator")
                for p in (root / plane).rglob("__init__.py")}
    assert sorted(packages - documented) == []
