"""The package's import graph: no cycles, and the runtime path stays apart from the tools.

Read from the source with ``ast`` (function-level imports included), so nothing is imported to check it.
The runtime path is what a ``gemmlab.matmul`` call runs: it must not pull in what times, tunes, plots,
registers or serves kernels (a heavy or circular import there is paid by every user at first call).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# What a gemmlab.matmul call imports, and what it must never reach.
RUNTIME = ("gemmlab.ops", "gemmlab.engine", "gemmlab.decode", "gemmlab.fp32", "gemmlab.kernelspec", "gemmlab.tuned",
           "gemmlab.epilogue", "gemmlab.schedule", "gemmlab.jit.compiler", "gemmlab.jit.launch", "gemmlab.jit.cache")
TOOLS = ("gemmlab.autotune", "gemmlab.bench", "gemmlab.timer", "gemmlab.figures", "gemmlab.plots",
         "gemmlab.cli", "gemmlab.mcp_server", "gemmlab.model", "gemmlab.inspect", "gemmlab.ladders",
         "gemmlab.registry", "gemmlab.suites", "gemmlab.matmul_suites")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "gemmlab").rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _edges() -> dict[str, set[str]]:
    """module -> the package modules it imports (relative and absolute, at any depth in the file)."""
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = m.split(".") if is_pkg else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    stem = base[: len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                    stem = ".".join(stem)
                else:
                    stem = node.module or ""
                # ``from pkg import a, b``: each name that is a module, else the module named (``from .x import y``)
                targets = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in mods] or [stem]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[m].update(t for t in targets if t in mods and t != m)
    return edges


def _reach(edges, start: str) -> dict[str, str]:
    """Every module reachable from ``start``, each with the module that imported it first."""
    seen, todo = {start: ""}, [start]
    while todo:
        m = todo.pop()
        for t in edges.get(m, ()):
            if t not in seen:
                seen[t] = m
                todo.append(t)
    return seen


def test_no_import_cycles():
    edges = _edges()
    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a]
                     if a in _reach(edges, b) and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


@pytest.mark.parametrize("module", RUNTIME)
def test_the_runtime_path_imports_no_tools(module):
    reached = _reach(_edges(), module)
    bad = sorted(t for t in reached if any(t == tool or t.startswith(tool + ".") for tool in TOOLS))
    assert not bad, f"{module} reaches {bad} (through {[reached[t] for t in bad]})"


def test_the_graph_is_read():
    """The checks above see real edges (a parser that found none would pass them vacuously)."""
    edges = _edges()
    assert "gemmlab.decode" in edges["gemmlab.engine"] and "gemmlab.fp32" in edges["gemmlab.ops"]
    assert "gemmlab.registry" in edges["gemmlab.autotune"]  # the second name of "from . import bench, registry"
