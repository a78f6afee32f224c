"""Where specbench finds data it did not get from the hub: the table of shipped reference names
(models, Medusa heads, trees, EAGLE heads; ``specbench zoo build`` fills their directory) and the one variable
naming a local data directory (prompt sets, published Medusa trees). It sits at the bottom of the
package so checkpoint resolution, tree loading and prompt sets can use it without importing the zoo."""

from __future__ import annotations

import os
from pathlib import Path

# the package's own builds; nothing here imports specbench.zoo, only its data folder is named
ARTIFACTS_DIR = Path(__file__).resolve().parent / "zoo" / "artifacts"
# a directory holding finished builds (e.g. a build's OUT_DIR), used instead of the package's own
ZOO_DIR_ENV = "SPECBENCH_ZOO_DIR"
BUILD_NAME = "gsm8k-tiny"
BUILD_COMMAND = "specbench zoo build OUT_DIR --install"

# a local directory of prompt sets and published trees, e.g. gsm8k/test.jsonl, medusa_trees/medusa_choices.json
DATA_DIR_ENV = "SPECBENCH_DATA_DIR"

# short name -> path inside the build directory
REFERENCES: dict[str, str] = {
    "specbench-ref/gsm8k-tiny": "target",
    "specbench-ref/gsm8k-tiny-medusa": "medusa",
    "specbench-ref/gsm8k-tiny-draft": "draft",
    "specbench-ref/gsm8k-tiny-eagle": "eagle",  # EAGLE-1/2 head (specbench zoo eagle)
    "specbench-ref/gsm8k-tiny-eagle3": "eagle3",  # EAGLE-3 head, 1,536-token draft vocabulary
    "gsm8k-tiny-63": "trees/gsm8k-tiny-63.json",
    "gsm8k-tiny-15": "trees/gsm8k-tiny-15.json",
}


class ReferenceMissing(FileNotFoundError):
    """A shipped reference name whose files are not there: the zoo was never built or installed here."""


def references_root() -> Path:
    """Where builds are looked up: ``$SPECBENCH_ZOO_DIR`` when set, else the package's artifacts."""
    override = os.environ.get(ZOO_DIR_ENV)
    return Path(override).expanduser() if override else ARTIFACTS_DIR


def reference_names(kind: str | None = None) -> list[str]:
    """Every shipped name, or those of one kind: ``"tree"`` (JSON files) or ``"model"`` (directories)."""
    if kind is None:
        return list(REFERENCES)
    if kind not in ("tree", "model"):
        raise ValueError(f"kind must be 'tree', 'model' or None, got {kind!r}")
    is_tree = kind == "tree"
    return [name for name, rel in REFERENCES.items() if rel.endswith(".json") == is_tree]


def resolve_reference(name: str) -> Path | None:
    """The path a shipped name stands for; None when ``name`` is not one (so callers go on to local
    directories and hub ids). Raises ReferenceMissing when it is one but is not installed."""
    if name not in REFERENCES:
        return None
    root = references_root()
    path = root / BUILD_NAME / REFERENCES[name]
    if not path.exists():
        where = f"${ZOO_DIR_ENV}={root}" if os.environ.get(ZOO_DIR_ENV) else "the package's zoo directory"
        raise ReferenceMissing(
            f"{name!r} is a specbench reference model, but {path} does not exist ({where}): the zoo has not "
            f"been built and installed here. Create it with `{BUILD_COMMAND}` (on a GPU: "
            f"`bash bench/zoo_build.sh OUT_DIR`, then `specbench zoo install OUT_DIR`), or set {ZOO_DIR_ENV} "
            "to the OUT_DIR of a finished build."
        )
    return path


def data_dir(override: str | os.PathLike | None = None) -> Path | None:
    """``override`` when given, else ``$SPECBENCH_DATA_DIR``; None when neither is set."""
    chosen = override if override is not None else os.environ.get(DATA_DIR_ENV)
    return Path(chosen).expanduser() if chosen else None
