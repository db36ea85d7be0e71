"""The package's import graph: no circle inside distribute/, and no layer imports a higher one.

Read from the sources (every import statement, lazy ones inside functions included), so a
circle or an upward import fails here whether or not a test happens to trigger it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "keras_efficientnet"
# The data flow, lowest first (STYLE: datasets -> models/layers -> optimizers -> training ->
# distribute -> cli).
LAYERS = ("datasets", "layers", "models", "optimizers", "training", "distribute", "cli")


def imports_of(path: Path) -> set[str]:
    """Modules of keras_efficientnet that `path` imports (absolute imports, as the code uses)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("keras_efficientnet.")}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_distribute_has_no_import_circle():
    modules = {module_name(p): p for p in (PACKAGE / "distribute").glob("*.py")}
    graph = {m: {i for i in imports_of(p) if i in modules and i != m}
             for m, p in modules.items() if not m.endswith("distribute")}
    done, stack = set(), []

    def visit(module):
        if module in stack:
            raise AssertionError(f"import circle: {' -> '.join(stack[stack.index(module):])}"
                                 f" -> {module}")
        if module in done:
            return
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            visit(other)
        stack.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert len(graph) >= 9  # the modules are really read


def test_no_layer_imports_a_higher_one():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2 or parts[0] not in LAYERS:
            continue
        rank = LAYERS.index(parts[0])
        for name in imports_of(path):
            target = name.split(".")[1]
            if target in LAYERS and LAYERS.index(target) > rank:
                upward.append(f"{module_name(path)} imports {name}")
    assert not upward, upward
