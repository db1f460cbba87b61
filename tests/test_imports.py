"""The package's imports: no cycle anywhere, and every import points down the layers.

The graph is read from the source with ``ast`` (imports inside functions
included: a lazy import is still a dependency), not from ``sys.modules``, so
it is the same whatever a test imported before. A module's layer is what its
docstring states ("Layer N of dpstream"); a module that states none takes its
package's (``dpstream.spark.kernels`` takes ``dpstream.spark``'s).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((SRC / "dpstream").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The dpstream modules ``name`` imports (a name imported from a package counts as
    its submodule when there is one; the compiled ``_loops`` is not a source module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(
                    parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                for a in node.names
                if a.name != "_loops"
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("dpstream") and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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


def test_the_package_has_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    """The check can fail: a planted edge back from a low module is a cycle."""
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted["dpstream.noise"].add("dpstream.cli")
    assert any("dpstream.noise" in c and "dpstream.cli" in c for c in _cycles(planted))


def _stated_layer(name: str) -> int | None:
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text("utf-8"))) or ""
    match = re.search(r"\b[Ll]ayer (\d)\b", doc)
    return int(match.group(1)) if match else None


def _layer(name: str) -> int | None:
    while name:
        layer = _stated_layer(name)
        if layer is not None:
            return layer
        name = name.rpartition(".")[0]
        if name == "dpstream":
            return None
    return None


def test_every_import_points_down_the_layers():
    """A module imports only modules of its own layer or lower ones (the package root,
    which re-exports the public names, is no layer of its own)."""
    upward = []
    for name, deps in GRAPH.items():
        mine = _layer(name)
        if mine is None:
            continue
        for dep in deps:
            theirs = _layer(dep)
            if theirs is not None and theirs > mine:
                upward.append(f"{name} (layer {mine}) imports {dep} (layer {theirs})")
    assert upward == []


def test_the_layers_are_stated():
    """Every module of the lower layers states its layer, so the check above sees it."""
    unstated = [n for n in MODULES if n != "dpstream" and _layer(n) is None]
    assert unstated == [], unstated
