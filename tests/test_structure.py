"""The package's shape: no import circles, and no source file past a size one person can hold in mind.

Imports are read from the source (every `import` and `from ... import`,
inside functions and under TYPE_CHECKING too): an import deferred into a
function to dodge a circle is still a circle in the design, since the two
modules can no longer be read, tested or moved apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "augury"
MAX_LINES = 500

# Files over MAX_LINES that other engineers are splitting now (issue 25). This list must shrink:
# take a file off it once it is under the limit, and never add one.
BEING_SPLIT: set[str] = set()

# Import circles that remain, each through an import deferred into a function. This list must
# shrink too: take a circle off once it is gone, and never add one.
KNOWN_CIRCLES: set[frozenset[str]] = set()  # none left: a new circle fails the test


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source.

    `from augury.x import y` counts as importing augury.x.y where y is a module,
    else augury.x (importing a submodule through its package is not a tie to
    the package's own code).
    """
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                imported |= submodules
                if len(submodules) < len(node.names):
                    imported.add(node.module)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_circles_are_found():
    """The walker itself: a circle through three modules is one component, a chain is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_new_import_circle():
    graph = import_graph()
    assert "augury.step" in graph and "augury.request" in graph["augury.step"], "the walker read no imports"
    new = [sorted(c) for c in circles(graph) if c not in KNOWN_CIRCLES]
    assert not new, f"import circles (each module imports another of its circle, maybe inside a function): {new}"


def test_no_source_file_is_over_the_line_limit():
    over = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and name not in BEING_SPLIT:
            over[name] = lines
    assert not over, f"over {MAX_LINES} lines: {over}; split each along its seams (see docs/design.md's map)"
