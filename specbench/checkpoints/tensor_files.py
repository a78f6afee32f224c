"""Read tensor files strictly: safetensors (single or sharded, lazily) and torch pickles (weights_only).

Every failure is a CheckpointError naming the file: empty, truncated, not of its format, corrupt, or
holding objects beyond tensors.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it stands; the message names the file, the key or field,
    the expected and the found value, and what to do."""


_REDO = "re-download it, re-export it, or check the copy"
# safetensors refuses headers above 100 MB ("header too large"); reading one that size is pointless
_MAX_HEADER_BYTES = 100_000_000
# bytes per element of the safetensors dtypes whose size is a whole number of bytes; others
# (sub-byte floats) are left to safetensors itself
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _looks_like(prefix: bytes) -> str:
    """What the first bytes of a file that is not the expected format look like, as a hint."""
    if prefix.startswith(b"version https://git-lfs"):
        return " (it is a Git LFS pointer: the weights were never fetched; run `git lfs pull` or re-download)"
    if prefix.startswith(b"PK\x03\x04"):
        return " (it starts like a zip archive, the format torch.save writes)"
    if prefix[:1] == b"\x80":
        return " (it starts like a Python pickle)"
    if prefix.lstrip()[:1] == b"<":
        return " (it starts like an HTML or XML page: a failed download?)"
    return ""


# ---------------------------------------------------------------- safetensors


def check_safetensors_file(path: Path) -> None:
    """Check a safetensors file's structure against its size, reading only its header: the 8-byte
    little-endian header length, a JSON object header, and data offsets that tile the rest of the
    file exactly. Raises CheckpointError (empty, not a safetensors file, truncated, corrupt)."""
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), expected a safetensors file; the download or copy did not complete: {_REDO}")
    with path.open("rb") as f:
        prefix = f.read(64)  # the length field, and enough to recognise what else the file is
        if size < 8:
            raise CheckpointError(
                f"{path}: not a safetensors file: it holds {size} bytes, fewer than the 8-byte header length "
                f"every safetensors file starts with; {_REDO}"
            )
        header_len = int.from_bytes(prefix[:8], "little")
        f.seek(8)
        opening = f.read(1)
        if opening == b"{" and 2 <= header_len <= _MAX_HEADER_BYTES and header_len > size - 8:
            raise CheckpointError(
                f"{path}: truncated: the header length field says {header_len} bytes of header but the file holds "
                f"only {size - 8} bytes after it; {_REDO}"
            )
        if opening != b"{" or not 2 <= header_len <= min(_MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(
                f"{path}: not a safetensors file: its first 8 bytes give a header length of {header_len} bytes "
                f"and the file holds {size} bytes in all{_looks_like(prefix)}; {_REDO}"
            )
        raw = opening + f.read(header_len - 1)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file: its {header_len}-byte header is not JSON ({e}); {_REDO}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, found {type(header).__name__}; {_REDO}")
    spans = [_tensor_span(path, key, info) for key, info in header.items() if key != "__metadata__"]
    data_bytes = size - 8 - header_len
    end = 0
    for begin, stop, key in sorted(spans):
        if begin != end:
            raise CheckpointError(
                f"{path}: corrupt safetensors header: tensor {key!r} starts at data offset {begin}, expected {end} "
                f"(tensors must tile the data without gaps or overlaps); {_REDO}"
            )
        end = stop
    if data_bytes < end:
        raise CheckpointError(f"{path}: truncated: header says {end} bytes of data but the file holds {data_bytes}; {_REDO}")
    if data_bytes > end:
        raise CheckpointError(
            f"{path}: corrupt: header says {end} bytes of data but the file holds {data_bytes} "
            f"({data_bytes - end} unaccounted bytes at the end); {_REDO}"
        )


def _tensor_span(path: Path, key: str, info: Any) -> tuple[int, int, str]:
    """(begin, end, key) of one header entry, checked for well-formed offsets, shape and byte size."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    shape = info.get("shape") if isinstance(info, dict) else None

    def natural(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(natural, offsets)) and offsets[0] <= offsets[1]):
        raise CheckpointError(
            f"{path}: corrupt safetensors header: tensor {key!r} has data_offsets {offsets!r}, expected [begin, end] "
            f"with 0 <= begin <= end; {_REDO}"
        )
    if not (isinstance(shape, list) and all(map(natural, shape))):
        raise CheckpointError(f"{path}: corrupt safetensors header: tensor {key!r} has shape {shape!r}, expected a list of sizes; {_REDO}")
    itemsize = _DTYPE_BYTES.get(info.get("dtype"))
    if itemsize is not None:
        numel = 1
        for dim in shape:
            numel *= dim
        if numel * itemsize != offsets[1] - offsets[0]:
            raise CheckpointError(
                f"{path}: corrupt safetensors header: tensor {key!r} ({info['dtype']}, shape {shape}) needs "
                f"{numel * itemsize} bytes but its data_offsets span {offsets[1] - offsets[0]}; {_REDO}"
            )
    return offsets[0], offsets[1], key


def _safetensors_keys(path: Path) -> list[str]:
    check_safetensors_file(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({_first_line(e)}); {_REDO}") from e


def _safetensors_read(path: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    check_safetensors_file(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            absent = sorted(set(keys) - set(f.keys()))
            if absent:
                raise CheckpointError(f"{path}: keys {absent} are listed for this file but not in it; re-download it")
            return {key: f.get_tensor(key) for key in keys}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({_first_line(e)}); {_REDO}") from e


def shard_map(index_file: Path, suffix: str = ".safetensors") -> dict[str, Path]:
    """key -> shard file of a sharded checkpoint index; shard names are untrusted input."""
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{index_file}: not valid JSON ({e}); re-download it") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_file}: expected a 'weight_map' object of key -> shard file")
    shards: dict[str, Path] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or name.startswith(".") or not name.endswith(suffix):
            raise CheckpointError(f"{index_file}: key {key!r} maps to {name!r}, expected a {suffix} file name in the same directory")
        shards[key] = index_file.parent / name
    return shards


# ---------------------------------------------------------------- torch pickles


def _refused_pickle(path: Path, error: pickle.UnpicklingError) -> CheckpointError:
    """The error for a pickle torch's safe unpickler refused. Only the offending global or opcode is
    taken from torch's text: the rest is advice on how to load the file unsafely, which a security
    refusal must never pass on."""
    text = str(error)
    # "Unsupported global: GLOBAL x.Y ..." or "Trying to load unsupported GLOBAL os.system whose module os is blocked"
    found = re.search(r"\bGLOBAL ([\w.]+)", text)
    opcode = re.search(r"Unsupported operand (\d+)", text)
    if found:
        what = f"it references {found.group(1)}"
    elif opcode:
        what = f"pickle opcode {opcode.group(1)} is not allowed"
    else:
        what = "the safe unpickler refused it"
    return CheckpointError(
        f"{path}: holds objects beyond tensors ({what}); specbench loads .pt files only with "
        "torch.load(weights_only=True) for safety (.bin files too): unpickling anything else can run arbitrary code; "
        "convert the file to safetensors (safetensors.torch.save_file) in an environment you trust, "
        "or get a safetensors copy from its publisher"
    )


def torch_load_state_dict(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """A state dict from a torch pickle, loaded with weights_only=True only (no arbitrary code).

    mmap=True maps the tensors instead of reading them (zip-format files only), for a cheap check;
    never keep such tensors while the file may be rewritten.
    """
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), expected a torch checkpoint; the download or copy did not complete: {_REDO}")
    with path.open("rb") as f:
        prefix = f.read(64)
    is_zip = prefix.startswith(b"PK\x03\x04")
    if not is_zip and prefix[:1] != b"\x80":
        raise CheckpointError(
            f"{path}: not a torch checkpoint: it is neither a zip archive (as torch.save writes) nor a pickle"
            f"{_looks_like(prefix)}; {_REDO}"
        )
    if is_zip and not zipfile.is_zipfile(path):
        # a zip archive's directory sits at its end, so a cut-short copy loses it first
        raise CheckpointError(
            f"{path}: truncated: it starts as a zip archive (the format torch.save writes) but its {size} bytes "
            f"end without the archive's central directory; {_REDO}"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except pickle.UnpicklingError as e:
        # `from None`: torch's message (kept out of any traceback) advises weights_only=False
        raise _refused_pickle(path, e) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt ({type(e).__name__}: {_first_line(e)}); {_REDO}") from e
    if not isinstance(loaded, dict) or not all(isinstance(key, str) for key in loaded):
        raise CheckpointError(f"{path}: expected a dict of str -> tensor (a state dict), found {type(loaded).__name__}")
    return loaded


# ---------------------------------------------------------------- any tensor file


def open_tensor_file(path: Path) -> tuple[list[str], Callable[[list[str]], dict[str, Any]]]:
    """(all keys, a reader of chosen keys); safetensors files are read lazily, so a whole model's base
    weights are never loaded just to extract its heads."""
    if path.name.endswith(".index.json"):
        shards = shard_map(path)

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


def read_model_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a transformers model directory: safetensors (single or sharded) or torch pickles (weights_only,
    single or sharded)."""
    for name in ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            keys, read = open_tensor_file(directory / name)
            return read(keys)
    index = directory / "pytorch_model.bin.index.json"
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(shard_map(index, ".bin").values())):
            state.update(torch_load_state_dict(directory / shard))
        return state
    raise CheckpointError(
        f"{directory}: no weights found (model.safetensors, model.safetensors.index.json, pytorch_model.bin "
        "or pytorch_model.bin.index.json)"
    )
