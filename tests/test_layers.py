"""specbench's packages and top-level modules import one another without a cycle, counting every
import in a file (lazy ones inside functions and TYPE_CHECKING blocks too), and the layers the
README's "Layout" section names import only downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "specbench"

README = PACKAGE_DIR.parent / "README.md"


def readme_layers() -> list[set[str]]:
    """The layers of the README's "Layout" table, bottom to top: the backticked units of each row.
    The README is the one statement of the layering; this test holds the code to it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Layout"):]
    layers = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0][:1].isdigit():
            layers.append({unit.strip("/") for unit in cells[1].split("`")[1::2]})
    return layers


def _unit(module: str) -> str | None:
    """The package-level unit of ``specbench.a.b``: ``a`` (a subpackage or a top-level module)."""
    parts = module.split(".")
    if parts[0] != "specbench" or len(parts) < 2:
        return None
    return parts[1]


def import_graph() -> dict[str, set[str]]:
    """unit -> units it imports (other than itself), from every import statement in its files."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        relative = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        unit = _unit(module)
        if unit is None:
            continue
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names] if prefix == "specbench" else [prefix]
            for target in targets:
                other = _unit(target)
                exists = other is not None and ((PACKAGE_DIR / other).is_dir() or (PACKAGE_DIR / f"{other}.py").is_file())
                if exists and other != unit:
                    edges.add(other)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of units (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        stack.append(unit)
        for other in sorted(graph.get(unit, ())):
            if state.get(other) == 1:
                return stack[stack.index(other):] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        stack.pop()
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in state and (cycle := visit(unit)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_package_level_import_graph_is_acyclic():
    graph = import_graph()
    assert {"engine", "checkpoints", "proposers", "gating", "prompts", "medusa"} <= set(graph)  # the walk saw the packages
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_every_unit_has_a_layer_and_imports_only_downwards():
    layers = readme_layers()
    assert len(layers) == 8, f"README's Layout table should list 8 layers, found {len(layers)}"
    layer_of = {unit: i for i, layer in enumerate(layers) for unit in layer}
    graph = import_graph()
    unplaced = sorted(set(graph) - set(layer_of))
    assert not unplaced, f"units with no layer in the README's Layout table: {unplaced}; add them where they belong"
    upward = sorted(
        f"{unit} (layer {layer_of[unit]}) imports {other} (layer {layer_of[other]})"
        for unit, others in graph.items() for other in others if layer_of[other] > layer_of[unit]
    )
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


@pytest.mark.parametrize("source, expected", [
    ("from specbench.engine import draft", {"engine"}),
    ("import specbench.gating.gates", {"gating"}),
    ("def f():\n    from specbench.zoo.build import x", {"zoo"}),
    ("from specbench import env, metrics", {"env", "metrics"}),
])
def test_lazy_and_aliased_imports_count(tmp_path, monkeypatch, source, expected):
    package = tmp_path / "specbench"
    (package / "engine").mkdir(parents=True)
    (package / "gating").mkdir()
    (package / "zoo").mkdir()
    for name in ("env.py", "metrics.py", "probe.py"):
        (package / name).write_text("")
    (package / "probe.py").write_text(source + "\n")
    monkeypatch.setitem(globals(), "PACKAGE_DIR", package)
    assert import_graph()["probe"] == expected
