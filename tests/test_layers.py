"""specbench's packages and top-level modules import one another without a cycle, counting every
import in a file (lazy ones inside functions and TYPE_CHECKING blocks too), and the layers the
README's "Layout" section names import only downwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_import_graph import find_cycle, plant
from test_import_graph import import_graph as module_graph

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


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """unit -> units it imports (other than itself): the module graph of every import statement (lazy ones too),
    each module taken to its unit."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph(package_dir).items():
        unit = _unit(module)
        if unit is None:
            continue
        graph.setdefault(unit, set()).update(other for target in targets
                                             if (other := _unit(target)) is not None and other != unit)
    return graph


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
def test_lazy_and_aliased_imports_count(tmp_path, source, expected):
    package = plant(tmp_path, {"engine/__init__.py": "", "engine/draft.py": "", "gating/__init__.py": "",
                               "gating/gates.py": "", "zoo/__init__.py": "", "zoo/build.py": "", "env.py": "",
                               "metrics.py": "", "probe.py": source + "\n"})
    assert import_graph(package)["probe"] == expected
