"""Medusa trees by name, file or list of paths: the shipped reference trees, the published ones under
``$SPECBENCH_DATA_DIR``, or a JSON file, as the engine's tree buffers (docs/tree_buffers.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence, Union

from specbench.engine.tree import TreeBuffers
from specbench.references import DATA_DIR_ENV, data_dir, reference_names, resolve_reference

PUBLISHED_TREES_FILE = Path("medusa_trees") / "medusa_choices.json"  # under $SPECBENCH_DATA_DIR

TreeSpec = Union[TreeBuffers, Sequence[Sequence[int]], str, os.PathLike]


def _read_tree_file(file: Path) -> list:
    try:
        content = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read Medusa tree file {file}: {error}") from error
    if isinstance(content, dict) and "paths" in content:
        return content["paths"]
    if isinstance(content, list):
        return content
    raise ValueError(
        f"Medusa tree file {file}: expected a JSON list of paths or an object with key 'paths' "
        f"(as save_tree_json writes), found a {type(content).__name__}"
        + (f" with keys {sorted(content)[:10]}" if isinstance(content, dict) else "")
    )


def _published_trees() -> tuple[Path | None, dict]:
    root = data_dir()
    if root is None:
        return None, {}
    file = root / PUBLISHED_TREES_FILE
    if not file.is_file():
        return file, {}
    try:
        content = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the published Medusa trees {file}: {error}") from error
    if not isinstance(content, dict):
        raise ValueError(f"{file}: expected a JSON object mapping tree names to lists of paths, found {type(content).__name__}")
    return file, content


def available_trees() -> dict[str, list[str]]:
    """Tree names :func:`load_tree` accepts: ``{"shipped": [...], "published": [...]}``."""
    return {"shipped": reference_names("tree"), "published": sorted(_published_trees()[1])}


def load_tree(spec: TreeSpec) -> TreeBuffers:
    """Tree buffers from a list of paths, a JSON file, or a tree name.

    Names are looked up first among the shipped reference trees (:mod:`specbench.references`), then in
    ``$SPECBENCH_DATA_DIR/medusa_trees/medusa_choices.json`` (the published Medusa trees).
    """
    if isinstance(spec, TreeBuffers):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        return TreeBuffers.from_paths(spec)
    file = Path(spec)
    if file.suffix == ".json" or file.is_file():
        if not file.is_file():
            raise FileNotFoundError(f"Medusa tree file {file} does not exist")
        return TreeBuffers.from_paths(_read_tree_file(file), name=file.stem)
    name = str(spec)
    shipped = resolve_reference(name)
    if shipped is not None:
        return TreeBuffers.from_paths(_read_tree_file(shipped), name=name)
    published_file, published = _published_trees()
    if name in published:
        return TreeBuffers.from_paths(published[name], name=name)
    if published_file is None:
        where = f"set {DATA_DIR_ENV} to a directory holding {PUBLISHED_TREES_FILE} to use the published trees"
    elif not published:
        where = f"{published_file} is missing, so no published trees are available"
    else:
        where = f"published trees in {published_file}: {', '.join(sorted(published))}"
    shipped_names = available_trees()["shipped"]
    raise ValueError(
        f"unknown Medusa tree {name!r}; shipped trees (`specbench zoo list`): "
        f"{', '.join(shipped_names) or 'none'}; {where}. A list of paths or a JSON file path also works."
    )
