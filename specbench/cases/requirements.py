"""What a case needs from this machine: its checkpoints (``${VAR}`` references expanded, the synthetic parts an older
``specbench zoo synth`` did not write named) and its hardware (a CUDA device, enough GPU memory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from specbench.cases import Case

_UNSET_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def expand_ref(ref: str, *, key: str = "target") -> str:
    """Expand ``${VAR}`` in a model or checkpoint reference; an unset variable is a clear error."""
    expanded = os.path.expandvars(ref)
    leftover = _UNSET_VARIABLE.search(expanded)
    if leftover:
        raise ValueError(
            f"case {key} {ref!r} uses the environment variable {leftover.group(1)}, which is not set; set it "
            f"(SPECBENCH_SYNTH_DIR: run `specbench zoo synth DIR` and export SPECBENCH_SYNTH_DIR=DIR; "
            f"SPECBENCH_SYNTH_1B_DIR: `specbench zoo synth DIR --shape 1b`)"
        )
    return expanded


def hardware_shortfall(case: Case) -> str | None:
    """What this machine lacks to run ``case`` ("no CUDA device", too little GPU memory), or None."""
    if not case.device.startswith("cuda") and not case.min_gpu_gib:
        return None
    from specbench import env

    return env.gpu_shortfall(case.min_gpu_gib or 0.0, env.gpu_inventory())


def unmet_requirements(case: Case) -> str | None:
    """Why this machine cannot run ``case``, naming it (no CUDA, too little GPU memory), or None."""
    shortfall = hardware_shortfall(case)
    return f"{case.case_id} (device={case.device!r}): {shortfall}" if shortfall else None


def missing_checkpoint(case: Case) -> str | None:
    """Why the case's target or proposer checkpoint is not here (unset variable, not in the cache while
    offline, no such directory), or None; nothing is downloaded when HF_HUB_OFFLINE=1."""
    from specbench.checkpoints.resolve import ModelUnavailable, resolve_model_dir
    from specbench.checkpoints.tiny import BUILTIN_TARGETS
    from specbench.references import ReferenceMissing

    refs = [("target", case.target)] if case.target not in BUILTIN_TARGETS else []
    if case.proposer.get("path"):
        refs.append(("proposer.path", case.proposer["path"]))
    for key, ref in refs:
        try:
            resolve_model_dir(expand_ref(ref, key=key))
        except (ModelUnavailable, ReferenceMissing, ValueError) as err:
            return _missing_synth_part(key, ref) or str(err)
    return None


_SYNTH_PART = re.compile(r"\$\{?(SPECBENCH_SYNTH\w*_DIR)\}?/([^/]+)$")


def _missing_synth_part(key: str, ref: str) -> str | None:
    """Which command writes a part a set synthetic directory lacks (one written before it had that part), or None."""
    match = _SYNTH_PART.match(ref)
    if not match:
        return None
    variable, part = match.groups()
    root = os.environ.get(variable)
    if not root or (Path(root) / part).exists():
        return None
    shape = " --shape 1b" if variable == "SPECBENCH_SYNTH_1B_DIR" else ""
    return (f"case {key} {ref!r}: {Path(root) / part} does not exist ({variable}={root} holds no {part}/, which an "
            f"older `specbench zoo synth` did not write); run `specbench zoo synth {root}{shape}` again to rewrite "
            "the directory with it")
