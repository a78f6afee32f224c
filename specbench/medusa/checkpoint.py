"""Medusa heads to and from checkpoint directories: the formats are :mod:`specbench.checkpoints.medusa`,
this builds the nn.Module from what it read (and hands a module's weights back to be written)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch

from specbench.checkpoints.medusa import first_heads, read_medusa_checkpoint, write_medusa_checkpoint
from specbench.checkpoints.medusa_config import MedusaCheckpointError
from specbench.checkpoints.validate import check_finite
from specbench.medusa.heads import MedusaHeads


def load_medusa_heads(
    ref: str | os.PathLike,
    *,
    hidden_size: int,
    vocab_size: int,
    num_heads: int | None = None,
    dtype: torch.dtype | None = None,
    allow_download: bool | None = None,
) -> MedusaHeads:
    """MedusaHeads (eval mode, no grad) from a checkpoint of any layout, checked against the target's
    hidden_size and vocab_size; num_heads=K keeps the first K heads; dtype casts (else the file's)."""
    checkpoint = read_medusa_checkpoint(ref, hidden_size=hidden_size, vocab_size=vocab_size, allow_download=allow_download)
    config, state_dict = first_heads(checkpoint, num_heads)
    dtypes = {tensor.dtype for tensor in state_dict.values()}
    if dtype is None and len(dtypes) > 1:
        raise MedusaCheckpointError(
            f"{checkpoint.weights_file}: tensors of mixed dtypes {sorted(map(str, dtypes))}; pass dtype= to choose one"
        )
    # built on the meta device: the real tensors are assigned, not copied into random ones
    with torch.device("meta"):
        heads = MedusaHeads(config)
    heads.load_state_dict(state_dict, strict=True, assign=True)
    if dtype is not None and dtypes != {dtype}:
        heads.to(dtype)
        # the file's values are finite (read_medusa_checkpoint checks), but a narrower dtype can overflow
        check_finite(
            heads.named_parameters(), str(checkpoint.weights_file), "parameter",
            f"values beyond {dtype}'s range became inf on the cast: load the heads in bfloat16 or float32",
        )
    return heads.eval().requires_grad_(False)


def save_medusa_heads(
    heads: MedusaHeads,
    out_dir: str | os.PathLike,
    *,
    layout: Literal["fasterdecoding", "vllm"],
    base_model_name_or_path: str,
    weights_format: Literal["safetensors", "pt"] = "safetensors",
) -> Path:
    """Write ``heads`` as a checkpoint directory of ``layout`` (atomic; see write_medusa_checkpoint)."""
    return write_medusa_checkpoint(
        heads.config, heads.state_dict(), out_dir,
        layout=layout, base_model_name_or_path=base_model_name_or_path, weights_format=weights_format,
    )
