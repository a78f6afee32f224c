"""specbench's modules import one another without a cycle, counting every import in a file (lazy ones inside
functions and TYPE_CHECKING blocks too), and the top of ``specbench/`` stays small: everything but a few
definitions and the front ends' entry points lives in a package (tests/test_layers.py holds the packages to the
README's layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "specbench"
# issue #28: a handful of definitions and entry points; ``__init__.py`` and the pytest plugin (pyproject's pytest11,
# which names specbench.pytest_plugin) count among them
MAX_TOP_LEVEL_FILES = 8


def module_name(path: Path, package_dir: Path) -> str:
    """``specbench/run/harness.py`` -> ``specbench.run.harness``; a package's ``__init__.py`` is the package."""
    relative = path.relative_to(package_dir.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every dotted name an import statement anywhere in ``tree`` asks for: ``import a.b`` gives ``a.b``,
    ``from a import b, c`` gives ``a.b`` and ``a.c`` (a submodule or a name of ``a``), relative imports resolved."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names += [f"{prefix}.{alias.name}" for alias in node.names]
    return names


def resolve(name: str, modules: set[str]) -> str | None:
    """The specbench module ``name`` lands in: the longest prefix that is a module (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """module -> the specbench modules it imports (other than itself), from every import statement in its file."""
    paths = {module_name(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))}
    modules = set(paths)
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {resolve(name, modules) for name in imported_names(tree, module, path.name == "__init__.py")}
        graph[module] = {target for target in targets if target is not None and target != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if state.get(other) == 1:
                return stack[stack.index(other):] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_module_import_graph_is_acyclic():
    graph = import_graph()
    # the walk saw the package's modules, packages and subpackage modules
    assert {"specbench", "specbench.pytest_plugin", "specbench.run.harness", "specbench.engine.decode"} <= set(graph)
    assert graph["specbench.run.harness"], "the harness imports nothing of specbench: the walk missed its imports"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between modules: {' -> '.join(cycle)}"


def test_top_of_the_package_holds_few_modules():
    top = sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_FILES, (
        f"specbench/ holds {len(top)} .py files at its top, at most {MAX_TOP_LEVEL_FILES} allowed: {top}; "
        "move a module into the package it belongs to")


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A throwaway ``specbench`` package of ``files`` (relative path -> source)."""
    package = tmp_path / "specbench"
    for name, source in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    return package


@pytest.mark.parametrize("source, expected", [
    ("from specbench.run import harness", {"specbench.run.harness"}),
    ("from specbench.run.harness import run_case", {"specbench.run.harness"}),
    ("import specbench.run.harness", {"specbench.run.harness"}),
    ("def f():\n    from specbench.io.jsonl import read", {"specbench.io.jsonl"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specbench import env", {"specbench.env"}),
    ("from specbench.run import ANSWER", {"specbench.run"}),  # a name of the package: its __init__
    ("from . import env", {"specbench.env"}),
    ("from .run.harness import run_case", {"specbench.run.harness"}),
    ("import os\nfrom pathlib import Path", set()),
])
def test_every_kind_of_import_counts(tmp_path, source, expected):
    package = plant(tmp_path, {"env.py": "", "probe.py": source + "\n", "run/__init__.py": "ANSWER = 42\n",
                                "run/harness.py": "", "io/__init__.py": "", "io/jsonl.py": ""})
    assert import_graph(package)["specbench.probe"] == expected


def test_relative_imports_in_a_package_resolve_from_it(tmp_path):
    package = plant(tmp_path, {"run/__init__.py": "from .harness import run_case\n", "run/harness.py": "",
                                "run/batch.py": "from .harness import run_case\nfrom .. import env\n", "env.py": ""})
    graph = import_graph(package)
    assert graph["specbench.run"] == {"specbench.run.harness"}
    assert graph["specbench.run.batch"] == {"specbench.run.harness", "specbench.env"}


def test_a_lazy_import_closes_a_cycle(tmp_path):
    package = plant(tmp_path, {"a.py": "from specbench import b\n",
                                "b.py": "def f():\n    from specbench.a import g\n"})
    assert find_cycle(import_graph(package)) == ["specbench.a", "specbench.b", "specbench.a"]
