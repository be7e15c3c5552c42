"""No import loops between the project's modules: a loop means two files that cannot be
understood, tested or changed one without the other. Every import counts: those inside
functions and those for type checking only too (deferring an import hides a loop, it does
not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "infergrid": ROOT / "infergrid",
    "device_plugin": ROOT / "device_plugin",
    "dra_driver": ROOT / "dra_driver",
    "scheduler_extender": ROOT / "scheduler_extender",
    "inference_operator": ROOT / "operator" / "inference_operator",
    "batching_engine": ROOT / "batching_engine",
    "images": ROOT / "images",
    "e2e": ROOT / "e2e",
}


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules one module imports, resolved to the deepest module named."""
    base = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                up = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                origin = ".".join([*up, origin] if origin else up)
            targets = [f"{origin}.{a.name}" for a in node.names] + [origin]
        else:
            stack.extend(ast.iter_child_nodes(node))
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    files = modules()
    known = set(files)
    return {
        name: _imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in files.items()
    }


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_loop_finder_finds_a_loop_and_only_a_loop():
    assert loops({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back():
    assert loops(import_graph()) == []


def parts(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between top-level packages (the project's parts)."""
    found: dict[str, set[str]] = {}
    for name, targets in graph.items():
        part = name.partition(".")[0]
        found.setdefault(part, set()).update(t.partition(".")[0] for t in targets)
        found[part].discard(part)
    return found


def test_no_part_imports_a_part_that_imports_it():
    """Parts are built and shipped one above another: the image builder (images/) below the
    local cluster and the tests that install its images (e2e/), the shared agreements
    (infergrid/) below everything. Two parts that import each other are one part."""
    assert loops(parts(import_graph())) == []
