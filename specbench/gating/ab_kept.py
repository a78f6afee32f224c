"""An A/B comparison's finished rounds kept on disk (``--runs-dir``), so that one cut short continues where it
stopped and a larger ``--rounds`` adds rounds (docs/ab.md#resume).

The directory holds ``comparison.json``, what makes two invocations the same comparison (both trees' contents, the
run settings, each side's --*-env), and one ``round-R-SPEC.json`` per finished pair of a round and a case spec. A
pair is kept only whole and only when neither side faulted: its two processes ran back to back on one machine, so
its log ratio is as sound as any other pair's, whichever machine a later invocation gets.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbench.io import strict_json
from specbench.io.atomic_write import write_text_atomic
from specbench.gating.ab_runs import ABRefused
from specbench.gating.worktrees import Tree, git

MANIFEST = "comparison.json"
SCHEMA = 1


def tree_content(tree: Tree) -> str:
    """The git tree hash of what ``tree`` checked out: equal for equal contents, whatever commit (or working-tree
    snapshot, whose commit hash differs at every invocation) holds them."""
    return git(tree.path, "rev-parse", "HEAD^{tree}")


def comparison_identity(base: Tree, head: Tree, run_args: list[str], side_env: dict[str, dict[str, str]]) -> dict:
    """What must match for kept rounds to be reused: the trees' contents, the run settings, the sides' --*-env."""
    return {"schema": SCHEMA, "base_tree": tree_content(base), "head_tree": tree_content(head),
            "run_args": list(run_args), "base_env": dict(side_env.get("base") or {}),
            "head_env": dict(side_env.get("head") or {})}


class KeptRounds:
    """The finished pairs of one comparison in ``directory``; ABRefused when it holds another comparison's."""

    def __init__(self, directory: Path | str, identity: dict):
        self.directory = Path(directory)
        manifest = self.directory / MANIFEST
        if manifest.is_file():
            try:
                found = json.loads(manifest.read_text(encoding="utf-8"))
            except ValueError as err:
                raise ABRefused(f"--runs-dir {self.directory}: {MANIFEST} is not JSON ({err}); remove the directory "
                                "to start the comparison over") from None
            differing = sorted(key for key in identity.keys() | found.keys() if identity.get(key) != found.get(key))
            if differing:
                raise ABRefused(f"--runs-dir {self.directory} holds the rounds of another comparison (its "
                                f"{', '.join(differing)} differ from this one's): give another directory, or remove "
                                "it to start over")
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_text_atomic(manifest, json.dumps(identity, indent=2, sort_keys=True) + "\n")

    def _path(self, round_index: int, spec: str) -> Path:
        return self.directory / f"round-{round_index}-{spec.replace('/', '_')}.json"

    def load(self, round_index: int, spec: str) -> dict[str, list[dict]] | None:
        """{"base": results, "head": results} of a kept pair, None when this pair has not finished."""
        path = self._path(round_index, spec)
        if not path.is_file():
            return None
        pair = json.loads(path.read_text(encoding="utf-8"))
        return {"base": pair["base"], "head": pair["head"]}

    def save(self, round_index: int, spec: str, by_side: dict[str, list[dict]]) -> None:
        """Keep a finished pair, unless a side faulted (a fault may be passing: the next invocation runs it again)."""
        if any("error" in result for results in by_side.values() for result in results):
            return
        pair = {"round": round_index, "spec": spec, "base": by_side["base"], "head": by_side["head"]}
        write_text_atomic(self._path(round_index, spec), strict_json.dumps(pair) + "\n")
