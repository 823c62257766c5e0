"""The fljax package's import graph read from its source, for the layering tests (tests/test_experiment.py: the
composition root; tests/test_data_registry.py: the data layers). Every import counts, at module level or inside a
function."""
import ast
import os

import fljax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fljax.__file__)))


def package_modules() -> dict[str, str]:
    """Module name → source path of every module of the fljax package (packages by their own name)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "fljax")):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The fljax modules a file imports, anywhere in it: ``from a.b import c`` is module ``a.b.c`` when there is
    one, else ``a.b``; the package itself (``import fljax``) is not counted."""
    with open(path) as f:
        tree = ast.parse(f.read())
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                        for a in node.names}
    return {t for t in targets if t in known and t != "fljax"}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The nodes reachable from ``start`` by one edge or more."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
