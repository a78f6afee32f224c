"""Turn a model reference (local directory or hub id "org/name") into a local directory, offline-aware,
and load a target causal LM from it.

A local directory wins; a hub id is looked up in the HF cache first and downloaded only when allowed.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch

from specbench.checkpoints.tensor_files import CheckpointError
from specbench.checkpoints.validate import TRANSFORMERS_LOAD_ERRORS, check_finite, check_target_dir, load_error
from specbench.references import resolve_reference

# the env flags huggingface_hub itself accepts as "on"
_TRUE_VALUES = {"1", "on", "yes", "true"}

# org/name: letters, digits, '.', '_', '-', each part starting and ending with a letter or digit,
# no '--' or '..' (the hub forbids them; '..' would also walk out of a directory)
HUB_ID_PATTERN = re.compile(
    r"^(?!.*(?:--|\.\.))"
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"/"
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$"
)

_FIX = (
    "to fix: point HF_HOME (or HF_HUB_CACHE) at a cache that holds it, download it first with "
    "`hf download {ref}` (older clients: `huggingface-cli download {ref}`), or pass a local directory"
)


class InvalidModelRef(ValueError):
    """A reference that is neither an existing local directory nor a well-formed hub id."""


class ModelUnavailable(Exception):
    """A well-formed reference whose files cannot be had here (not local, not cached, no download)."""

    def __init__(self, ref: str | os.PathLike, reason: str, *, tried: list[str] | tuple[str, ...] = ()):
        self.ref = os.fspath(ref)
        self.reason = reason
        self.tried = tuple(tried)
        lines = [f"model {self.ref!r} is unavailable: {reason}"]
        if self.tried:
            lines.append("tried: " + "; ".join(self.tried))
        lines.append(_FIX.format(ref=self.ref))
        super().__init__("\n".join(lines))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE_VALUES


def hf_hub_cache_dir() -> Path:
    """The hub cache directory as huggingface_hub would pick it, read from the environment *now*
    (huggingface_hub reads it once at import, which would miss a later HF_HOME change)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "huggingface" / "hub"


def _check_ref_string(ref: str) -> None:
    if not ref or any(ch in ref for ch in "\x00\n\r"):
        raise InvalidModelRef(f"model reference {ref!r} is empty or holds control characters")


def resolve_model_dir(ref: str | os.PathLike, *, allow_download: bool | None = None) -> Path:
    """Return a local directory holding the model `ref` names.

    `ref` is a local directory, or a hub id "org/name" looked up in the HF cache (HF_HUB_CACHE /
    HF_HOME) and, when allowed, downloaded. allow_download=None means "allowed unless
    HF_HUB_OFFLINE=1"; HF_HUB_OFFLINE=1 forbids downloads even when allow_download=True.
    Raises InvalidModelRef for a malformed ref, ModelUnavailable when the files cannot be had.
    """
    if not isinstance(ref, (str, os.PathLike)):
        raise TypeError(f"model reference must be a str or os.PathLike, got {type(ref).__name__}")
    ref_str = os.fspath(ref)
    zoo_path = resolve_reference(ref_str)
    if zoo_path is not None:
        return zoo_path
    _check_ref_string(ref_str)

    local = Path(ref_str).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.exists():
        raise InvalidModelRef(f"model reference {ref_str!r} is a file ({local.resolve()}); pass the directory that holds config.json")
    if isinstance(ref, os.PathLike) or not HUB_ID_PATTERN.match(ref_str):
        raise InvalidModelRef(
            f"model reference {ref_str!r}: no local directory at {local.absolute()}, and it is not a hub id "
            "of the form 'org/name' (letters, digits, '.', '_', '-'; no '--' or '..'). "
            "Pass an existing directory or a hub id such as 'lmsys/vicuna-7b-v1.3'."
        )

    # imported here so that resolving a local directory never needs huggingface_hub
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache_dir = hf_hub_cache_dir()
    tried = [f"local directory {local.absolute()} (absent)"]
    try:
        return Path(huggingface_hub.snapshot_download(ref_str, cache_dir=cache_dir, local_files_only=True))
    except LocalEntryNotFoundError:
        tried.append(f"HF cache {cache_dir} (no snapshot of {ref_str})")

    offline = _env_flag("HF_HUB_OFFLINE")
    if offline or allow_download is False:
        why = "HF_HUB_OFFLINE=1 is set" if offline else "allow_download=False"
        tried.append(f"hub download (not attempted: {why})")
        raise ModelUnavailable(ref_str, f"not in the HF cache and downloading is off ({why})", tried=tried)

    try:
        return Path(huggingface_hub.snapshot_download(ref_str, cache_dir=cache_dir))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        # LocalEntryNotFoundError here means the hub could not be reached and nothing was cached;
        # HfHubHTTPError covers missing, gated and private repos
        tried.append(f"hub download into {cache_dir} (failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        raise ModelUnavailable(ref_str, "not in the HF cache, and the hub download failed (hub unreachable, repo missing or gated)", tried=tried) from e


def load_target_model(ref: str | os.PathLike, *, dtype: torch.dtype, device: str | torch.device, allow_download: bool | None = None):
    """A transformers AutoModelForCausalLM for `ref`, in `dtype` on `device`, in eval mode.

    Never runs code shipped with the checkpoint (trust_remote_code=False) and unpickles weights only
    with weights_only=True. A damaged directory (config.json, a truncated, empty or foreign weights
    file, a missing shard, weights missing from the files, NaN/inf weights) raises a one-line
    CheckpointError naming the file or directory.
    """
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model_dir(ref, allow_download=allow_download)
    check_target_dir(model_dir)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=False, local_files_only=True, weights_only=True, output_loading_info=True
        )
    except CheckpointError:
        raise
    except TRANSFORMERS_LOAD_ERRORS as e:
        # a refused pickle's traceback would show torch's advice to load it with weights_only=False
        raise load_error(model_dir, e) from (None if isinstance(e, pickle.UnpicklingError) else e)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        # transformers would initialise these randomly, and every measurement would be meaningless
        raise CheckpointError(
            f"{model_dir}: {len(missing)} weight(s) the model needs are not in its weights files, first {missing[0]!r}; "
            "the checkpoint is incomplete or for another architecture: re-download or re-export it"
        )
    model = model.to(device).eval()
    fix = "the weights are corrupt or the model diverged: re-download or re-export it"
    if dtype == torch.float16:
        fix = f"in torch.float16 values beyond 65504 become inf: load it in bfloat16 or float32; if it still fails, {fix}"
    # after the move: on an accelerator the pass over every weight is cheap
    check_finite(model.named_parameters(), str(model_dir), "parameter", fix)
    return model
