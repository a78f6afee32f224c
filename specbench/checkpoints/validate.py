"""Check a target model directory before transformers reads it, and loaded weights for NaN/inf.

transformers reports a damaged file as a long traceback from deep inside its loader; these checks
turn each case into one CheckpointError line naming the file, what is wrong, and what to do.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError

from specbench.checkpoints.tensor_files import (
    CheckpointError,
    check_safetensors_file,
    shard_map,
    torch_load_state_dict,
)

# the weights files transformers looks for, in its order of preference
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_REDO = "re-download the model, re-export it with save_pretrained, or check the copy"
# what transformers' loader raises for a bad directory (last resort, after the checks below)
TRANSFORMERS_LOAD_ERRORS = (OSError, ValueError, RuntimeError, SafetensorError, pickle.UnpicklingError)


def read_json_object(path: Path) -> dict:
    """The JSON object in `path` (a config.json), or a CheckpointError naming the file."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}); {_REDO}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(raw).__name__}; {_REDO}")
    return raw


def check_target_dir(directory: Path) -> None:
    """config.json is a JSON object, and every weights file transformers will read is structurally
    whole: safetensors headers against file sizes, every shard of an index, pickles through
    torch.load(weights_only=True, mmap=True) (tensors mapped, not read)."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory}: no config.json; a target model directory needs the one save_pretrained writes; {_REDO}")
    read_json_object(config_file)

    present = [name for name in SAFETENSORS_FILES if (directory / name).is_file()]
    if present:
        suffix, check = ".safetensors", check_safetensors_file
    else:
        # transformers reads pytorch_model.bin only when no safetensors file is there
        present = [name for name in PICKLE_FILES if (directory / name).is_file()]
        suffix, check = ".bin", lambda path: torch_load_state_dict(path, mmap=True)
    if not present:
        raise CheckpointError(
            f"{directory}: no weights file; looked for {', '.join(SAFETENSORS_FILES + PICKLE_FILES)}, "
            f"found {sorted(p.name for p in directory.iterdir())}; {_REDO}"
        )
    for name in present:
        if not name.endswith(".index.json"):
            check(directory / name)
            continue
        index_file = directory / name
        for shard in sorted(set(shard_map(index_file, suffix).values())):
            if not shard.is_file():
                raise CheckpointError(f"{index_file}: lists shard {shard.name}, which is missing from {directory}; {_REDO}")
            check(shard)


def load_error(directory: Path, error: BaseException) -> CheckpointError:
    """One line for an error transformers raised while loading `directory` (the checks above passed)."""
    if isinstance(error, pickle.UnpicklingError):
        # not quoted: torch's text advises loading the file with weights_only=False
        return CheckpointError(
            f"{directory}: a weights file holds objects beyond tensors; specbench loads pickled weights only with "
            "torch.load(weights_only=True), for safety; convert them to safetensors in an environment you trust"
        )
    reason = (str(error).strip().splitlines() or [""])[0][:300]
    return CheckpointError(f"{directory}: transformers could not load the model ({type(error).__name__}: {reason}); {_REDO}")


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], where: str, what: str, fix: str) -> None:
    """Refuse NaN/inf anywhere in `tensors` ((name, tensor) pairs), naming the first offending one.

    Reads every value once (torch.isfinite per tensor): about one extra pass over the weights, small
    next to loading them.
    """
    bad: list[tuple[str, torch.Tensor]] = []
    for name, tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.device.type != "meta":
            if not bool(torch.isfinite(tensor).all()):
                bad.append((name, tensor))
    if not bad:
        return
    name, tensor = bad[0]
    count = int((~torch.isfinite(tensor)).sum())
    others = f"; {len(bad) - 1} other {what}(s) hold NaN/inf too" if len(bad) > 1 else ""
    raise CheckpointError(
        f"{where}: {what} {name!r} holds {count} non-finite value(s) (NaN or inf) of {tensor.numel()} "
        f"({tensor.dtype}){others}; {fix}"
    )
