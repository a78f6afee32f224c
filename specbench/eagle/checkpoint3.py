"""EAGLE-3 draft heads to and from the published layout (config.json + pytorch_model.bin or model.safetensors),
read strictly: every refusal is one Eagle3CheckpointError naming the file and the key (docs/eagle.md#eagle-3)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file

from specbench.checkpoints.resolve import resolve_model_dir
from specbench.checkpoints.tensor_files import CheckpointError, open_tensor_file
from specbench.checkpoints.validate import check_finite, read_json_object
from specbench.eagle.checkpoint import (EagleCheckpointError, _field, _find_weights_file, _staged_directory, check_target_fit,
                                        read_eagle_config)
from specbench.eagle.eagle3 import NUM_AUX_LAYERS, Eagle3Config, Eagle3Head

VOCAB_MAP_KEYS = ("d2t", "t2d")
_REDO = "re-download the EAGLE-3 draft head or re-export it"


class Eagle3CheckpointError(EagleCheckpointError):
    """An EAGLE-3 draft-head directory that does not describe a head this loader can build for the target."""


def read_eagle3_config(file: Path) -> Eagle3Config:
    """The Eagle3Config a draft head's config.json describes (the EAGLE-1/2 fields, plus ``draft_vocab_size``)."""
    raw = read_json_object(file)
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise Eagle3CheckpointError(
            f"{file}: num_hidden_layers = {layers!r}; the EAGLE-3 draft head is one decoder layer (cnets.py's midlayer)"
        )
    base = read_eagle_config(file)
    draft_vocab = _field(raw, "draft_vocab_size", file, int, base.vocab_size)
    if draft_vocab > base.vocab_size:
        raise Eagle3CheckpointError(
            f"{file}: draft_vocab_size = {draft_vocab} exceeds vocab_size = {base.vocab_size}; the draft vocabulary is "
            "a subset of the target's"
        )
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != base.hidden_size:
        raise Eagle3CheckpointError(
            f"{file}: target_hidden_size = {target_hidden!r} differs from hidden_size = {base.hidden_size}; heads whose "
            "fc reads a target of another width are not supported"
        )
    return Eagle3Config.from_eagle(base, draft_vocab)


def expected_shapes3(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every float key an EAGLE-3 weights file must hold, with its shape (``d2t``/``t2d`` are checked apart)."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {
        "fc.weight": (h, NUM_AUX_LAYERS * h),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (config.draft_vocab_size, h),
    }


def _check_keys(weights_file: Path, keys: list[str], config: Eagle3Config) -> None:
    expected = expected_shapes3(config)
    missing = sorted(set(expected) - set(keys))
    if missing:
        more = f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else ""
        raise Eagle3CheckpointError(
            f"{weights_file}: key {missing[0]!r} is missing{more}; an EAGLE-3 head needs {sorted(expected)}; the file is "
            f"incomplete or another layout (an EAGLE-1/2 head has layers.0.*): {_REDO}"
        )
    unexpected = sorted(set(keys) - set(expected) - set(VOCAB_MAP_KEYS))
    if unexpected:
        hint = "; EAGLE-3 drafts embed through the target's embedding" if unexpected[0] == "embed_tokens.weight" else ""
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise Eagle3CheckpointError(
            f"{weights_file}: unexpected key {unexpected[0]!r}{more}{hint}; an EAGLE-3 head holds only "
            f"{sorted(set(expected) | set(VOCAB_MAP_KEYS))}"
        )
    if "t2d" in keys and "d2t" not in keys:
        raise Eagle3CheckpointError(f"{weights_file}: key 't2d' is present without 'd2t'; {_REDO}")
    if "d2t" not in keys and config.draft_vocab_size != config.vocab_size:
        raise Eagle3CheckpointError(
            f"{weights_file}: key 'd2t' is missing, but draft_vocab_size {config.draft_vocab_size} is smaller than "
            f"vocab_size {config.vocab_size}: the draft-to-target id map is needed; {_REDO}"
        )


def _check_tensors(weights_file: Path, config_file: Path, tensors: dict[str, Any], config: Eagle3Config) -> None:
    expected = expected_shapes3(config)
    for key in sorted(expected):
        tensor = tensors[key]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            what = f"a {tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) else f"a {type(tensor).__name__}"
            raise Eagle3CheckpointError(f"{weights_file}: key {key!r} holds {what}, expected a floating-point tensor; {_REDO}")
        if tuple(tensor.shape) != expected[key]:
            raise Eagle3CheckpointError(
                f"{weights_file}: key {key!r} has shape {tuple(tensor.shape)}, expected {expected[key]} from {config_file} "
                f"(hidden_size {config.hidden_size}, intermediate_size {config.intermediate_size}, "
                f"{config.num_attention_heads} heads, {config.num_key_value_heads} key/value heads, draft_vocab_size "
                f"{config.draft_vocab_size}); is config.json the head's own? {_REDO}"
            )
    _check_vocab_map(weights_file, tensors, config)


def _check_vocab_map(weights_file: Path, tensors: dict[str, Any], config: Eagle3Config) -> None:
    """``d2t`` (Vd,) int64 maps every draft id into [0, V), injectively; ``t2d`` (V,) bool marks exactly those ids."""
    draft_vocab, vocab = config.draft_vocab_size, config.vocab_size
    for key, dtype, size in (("d2t", torch.int64, draft_vocab), ("t2d", torch.bool, vocab)):
        tensor = tensors.get(key)
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tuple(tensor.shape) != (size,):
            what = f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else \
                f"a {type(tensor).__name__}"
            raise Eagle3CheckpointError(f"{weights_file}: key {key!r} holds {what}, expected {dtype} of shape ({size},)")
    if "d2t" not in tensors:
        return
    target_ids = torch.arange(draft_vocab) + tensors["d2t"]  # (Vd,)
    bad = ((target_ids < 0) | (target_ids >= vocab)).nonzero()
    if bad.numel():
        first = int(bad[0])
        raise Eagle3CheckpointError(
            f"{weights_file}: key 'd2t' maps draft id {first} to target id {int(target_ids[first])}, outside [0, {vocab}) "
            f"({bad.numel()} such ids); the head was built for another tokenizer: {_REDO}"
        )
    if target_ids.unique().numel() != draft_vocab:
        raise Eagle3CheckpointError(f"{weights_file}: key 'd2t' maps two draft ids to one target id; {_REDO}")
    if "t2d" in tensors:
        marked = torch.zeros(vocab, dtype=torch.bool)
        marked[target_ids] = True
        if not torch.equal(marked, tensors["t2d"]):
            raise Eagle3CheckpointError(
                f"{weights_file}: key 't2d' marks {int(tensors['t2d'].sum())} target ids, which are not the "
                f"{draft_vocab} that 'd2t' maps to; {_REDO}"
            )


def load_eagle3_head(
    ref: str | os.PathLike,
    *,
    target_hidden_size: int,
    target_vocab_size: int,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    allow_download: bool | None = None,
) -> Eagle3Head:
    """An Eagle3Head (prepared, eval, no grad) from a draft-head directory or hub id, checked against the target's
    hidden and vocabulary sizes; ``dtype`` casts every float tensor (None: ``fc.weight``'s dtype)."""
    directory = resolve_model_dir(ref, allow_download=allow_download)
    try:
        return _load(directory, target_hidden_size, target_vocab_size, dtype, device)
    except Eagle3CheckpointError:
        raise
    except CheckpointError as error:  # EAGLE-1/2 config reader's and the shared readers': one class here
        raise Eagle3CheckpointError(str(error)) from None


def _load(directory: Path, target_hidden_size: int, target_vocab_size: int, dtype, device) -> Eagle3Head:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise Eagle3CheckpointError(f"{directory}: no config.json; an EAGLE-3 head ships a one-layer Llama config.json")
    config = read_eagle3_config(config_file)
    check_target_fit(config_file, config, target_hidden_size, target_vocab_size, Eagle3CheckpointError,
                     "this EAGLE-3 head", "the head")
    weights_file = _find_weights_file(directory)
    keys, read = open_tensor_file(weights_file)
    _check_keys(weights_file, keys, config)
    tensors = read(sorted(keys))
    _check_tensors(weights_file, config_file, tensors, config)
    floats = sorted(expected_shapes3(config))
    fix = "the head is corrupt or diverged in training: re-download it, or re-train and re-export it"
    check_finite(((key, tensors[key]) for key in floats), str(weights_file), "key", fix)
    dtype = tensors["fc.weight"].dtype if dtype is None else dtype
    cast = {key: tensors[key].to(device=device, dtype=dtype) for key in floats}
    if any(tensors[key].dtype != dtype for key in floats):  # finite in the file; a narrower dtype can overflow
        check_finite(((key, cast[key]) for key in floats), str(weights_file), "key",
                     f"values beyond {dtype}'s range became inf on the cast: load the head in bfloat16 or float32")
    with_map = "d2t" in tensors
    if with_map:
        cast["d2t"] = tensors["d2t"].to(device)
        cast["t2d"] = tensors["t2d"].to(device) if "t2d" in tensors else _t2d(tensors["d2t"], config.vocab_size).to(device)
    with torch.device("meta"):  # the real tensors are assigned, not copied into random ones
        head = Eagle3Head(config, with_vocab_map=with_map)
    head.load_state_dict(cast, strict=True, assign=True)
    return head.prepare()


def _t2d(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    marked = torch.zeros(vocab, dtype=torch.bool)
    marked[torch.arange(d2t.numel()) + d2t.cpu()] = True
    return marked


def save_eagle3_head(
    out_dir: str | os.PathLike,
    head: Eagle3Head,
    *,
    format: Literal["bin", "safetensors"] = "bin",
    with_vocab_map: bool = True,
) -> Path:
    """Write ``head`` in the published layout under exactly the published key names; ``with_vocab_map=False``
    leaves out ``d2t``/``t2d`` (only for a draft vocabulary equal to the target's). Atomic, as save_eagle_head."""
    if format not in ("bin", "safetensors"):
        raise ValueError(f"format={format!r}; expected 'bin' or 'safetensors'")
    config = head.config
    if not with_vocab_map and config.draft_vocab_size != config.vocab_size:
        raise ValueError(f"draft_vocab_size {config.draft_vocab_size} < vocab_size {config.vocab_size}: d2t is needed")
    state = head.state_dict()
    # clone: fused q/k/v and gate/up are views of one tensor, and safetensors refuses shared storage
    tensors = {key: state[key].detach().to("cpu").contiguous().clone() for key in sorted(expected_shapes3(config))}
    if with_vocab_map:
        d2t = head.d2t.cpu() if head.d2t is not None else torch.zeros(config.draft_vocab_size, dtype=torch.long)
        tensors.update(d2t=d2t.clone(), t2d=_t2d(d2t, config.vocab_size))
    raw = {**config.to_json(), "torch_dtype": str(tensors["fc.weight"].dtype).removeprefix("torch.")}
    out_dir = Path(out_dir)
    with _staged_directory(out_dir) as staging:
        (staging / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if format == "bin":
            torch.save(tensors, staging / "pytorch_model.bin")
        else:
            save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
    return out_dir
