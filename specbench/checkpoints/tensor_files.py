"""Read tensor files strictly: safetensors (single or sharded, lazily) and torch pickles (weights_only).

Every failure is a CheckpointError naming the file: truncated, corrupt, or holding non-tensor objects.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it stands; the message names the file, the key or field,
    the expected and the found value, and what to do."""


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def torch_load_state_dict(path: Path) -> dict[str, Any]:
    """A state dict from a torch pickle, loaded with weights_only=True only (no arbitrary code)."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        reason = next((line.strip() for line in str(e).splitlines() if "WeightsUnpickler error" in line), _first_line(e))
        # torch goes on to suggest allow-listing the class, which is exactly what we do not want
        reason = reason.split(". Please use")[0]
        raise CheckpointError(
            f"{path}: holds objects other than tensors, so torch.load(weights_only=True) refused it ({reason}). "
            "Loading it fully could run arbitrary code; convert it to safetensors where you trust its source."
        ) from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt ({type(e).__name__}: {_first_line(e)}); re-download it") from e
    if not isinstance(loaded, dict) or not all(isinstance(key, str) for key in loaded):
        raise CheckpointError(f"{path}: expected a dict of str -> tensor (a state dict), found {type(loaded).__name__}")
    return loaded


def _safetensors_keys(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({e}); re-download it") from e


def _safetensors_read(path: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            absent = sorted(set(keys) - set(f.keys()))
            if absent:
                raise CheckpointError(f"{path}: keys {absent} are listed for this file but not in it; re-download it")
            return {key: f.get_tensor(key) for key in keys}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({e}); re-download it") from e


def _shard_map(index_file: Path) -> dict[str, Path]:
    """key -> shard file of a sharded safetensors checkpoint; shard names are untrusted input."""
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{index_file}: not valid JSON ({e}); re-download it") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_file}: expected a 'weight_map' object of key -> shard file")
    shards: dict[str, Path] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or name.startswith(".") or not name.endswith(".safetensors"):
            raise CheckpointError(f"{index_file}: key {key!r} maps to {name!r}, expected a .safetensors file name in the same directory")
        shards[key] = index_file.parent / name
    return shards


def open_tensor_file(path: Path) -> tuple[list[str], Callable[[list[str]], dict[str, Any]]]:
    """(all keys, a reader of chosen keys); safetensors files are read lazily, so a whole model's base
    weights are never loaded just to extract its heads."""
    if path.name.endswith(".index.json"):
        shards = _shard_map(path)

        def read_sharded(keys: list[str]) -> dict[str, Any]:
            by_shard: dict[Path, list[str]] = {}
            for key in keys:
                by_shard.setdefault(shards[key], []).append(key)
            tensors: dict[str, Any] = {}
            for shard, shard_keys in by_shard.items():
                if not shard.is_file():
                    raise CheckpointError(f"{path}: shard {shard.name} (holding {shard_keys[0]!r}) is missing from {path.parent}")
                tensors.update(_safetensors_read(shard, shard_keys))
            return tensors

        return list(shards), read_sharded
    if path.suffix == ".safetensors":
        return _safetensors_keys(path), lambda keys: _safetensors_read(path, keys)
    state = torch_load_state_dict(path)
    return list(state), lambda keys: {key: state[key] for key in keys}
