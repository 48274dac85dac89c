"""The package's modules import each other without a cycle, and each imports only from its own
subpackage and the layers below it: every import counts, including those inside functions and under
TYPE_CHECKING, so that the tree shows the architecture and the layers stay layers."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "megacache"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The package's modules ``name`` imports (a package's ``__init__`` counts as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    known = modules()
    assert "megacache.builders.build" in known and "megacache.interfaces.cli" in known
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "megacache.builders.config" in graph["megacache.builders.blend"]
    assert cycles(graph) == []


#: the subpackages bottom up (megacache/__init__.py says what each holds); the package's own
#: ``__init__`` re-exports the Python API and so sits on top
LAYERS = ("errors", "runtime", "formats", "algorithms", "megatron", "text", "builders", "readers", "interfaces",
          "__main__", "")


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "")


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_upward_imports_are_found():
    assert upward({"megacache.formats.npy": {"megacache.builders.gpt", "megacache.runtime.fsio"}}) == \
        ["megacache.formats.npy -> megacache.builders.gpt"]


def test_every_module_imports_only_its_own_layer_and_those_below():
    known = modules()
    assert {name.split(".")[1] for name in known if name.count(".")} == set(LAYERS[:-1])
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "megacache.runtime.kernels" in graph["megacache.algorithms.gpt_index"]
    assert upward(graph) == []
