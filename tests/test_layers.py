"""The data plane stands alone: every ``workloads`` module imports without the control plane
(``orchestrator``) and without Ray, MLflow or Optuna, so a workload runs and is tested without them."""

import subprocess
import sys

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


def _import_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, function-local imports included
    (a local import must not hide a cycle). ``from a import b`` names the module ``a.b`` when it
    is one, else ``a``."""
    import ast
    from pathlib import Path

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


def test_no_import_cycle_even_through_function_local_imports():
    graph = _import_graph()
    assert len(graph) > 60
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
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
    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert cycles == [], f"import cycles: {cycles}"
