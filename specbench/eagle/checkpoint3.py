"""EAGLE-3 draft heads to and from the published layouts (config.json + pytorch_model.bin or model.safetensors):
SafeAILab's (``midlayer.*``) and the one vLLM loads (speculators' config.json, ``layers.0.*``; layout_speculators.py),
read strictly: every refusal is one Eagle3CheckpointError naming the file and the key (docs/eagle.md#eagle-3)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import torch

from specbench.checkpoints.resolve import resolve_model_dir
from specbench.checkpoints.tensor_files import open_tensor_file
from specbench.checkpoints.validate import read_json_object
from specbench.eagle import layout_speculators as speculators
from specbench.eagle.checkpoint import (Eagle3CheckpointError, _find_weights_file, assign_weights, cast_finite,
                                        check_aux_flag, check_floating, check_target_fit, config_field,
                                        read_eagle_config, refusing_as, write_head_directory)
from specbench.eagle.eagle3 import NUM_AUX_LAYERS, Eagle3Config, Eagle3Head, eagle3_aux_layers

VOCAB_MAP_KEYS = ("d2t", "t2d")
LAYOUTS = ("safeailab", "speculators")
_REDO = "re-download the EAGLE-3 draft head or re-export it"


def read_eagle3_config(file: Path) -> Eagle3Config:
    """The Eagle3Config a flat (SafeAILab) config.json describes: the EAGLE-1/2 fields, plus ``draft_vocab_size``
    and ``norm_before_residual`` (default false)."""
    raw = read_json_object(file)
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise Eagle3CheckpointError(
            f"{file}: num_hidden_layers = {layers!r}; the EAGLE-3 draft head is one decoder layer (cnets.py's midlayer)"
        )
    base = read_eagle_config(file)
    draft_vocab = config_field(raw, "draft_vocab_size", f"{file}: ", int, base.vocab_size)
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
    check_aux_flag(raw, f"{file}: ")
    return Eagle3Config.from_eagle(base, draft_vocab, config_field(raw, "norm_before_residual", f"{file}: ", bool, False))


def expected_shapes3(config: Eagle3Config, layout: str = "safeailab") -> dict[str, tuple[int, ...]]:
    """Every float key an EAGLE-3 weights file of ``layout`` must hold, with its shape (``d2t``/``t2d`` and the
    speculators layout's optional ``embed_tokens.weight`` are checked apart)."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {
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
    if layout == "safeailab":
        return shapes
    return {speculators.to_file_key(key): shape for key, shape in shapes.items()}


def _optional_keys(layout: str) -> set[str]:
    return set(VOCAB_MAP_KEYS) | ({"embed_tokens.weight"} if layout == "speculators" else set())


def _unexpected_hint(key: str, layout: str) -> str:
    if key == "embed_tokens.weight":
        return "; SafeAILab EAGLE-3 drafts embed through the target's embedding (only the speculators layout ships one)"
    if key == "mask_hidden":
        return "; a parallel-drafting (P-EAGLE) head, which specbench does not run"
    if key.startswith(("input_norm.", "fc_norm.")):
        return "; a norm before fc (norm_before_fc / fc_norm, EAGLE-3.1), which Eagle3Head does not have"
    if key.startswith("layers.") and not key.startswith("layers.0."):
        return "; a second decoder layer: Eagle3Head has one"
    if key.startswith(("layers.0.", "midlayer.")):
        return f"; the {layout} layout names the layer {'midlayer' if layout == 'safeailab' else 'layers.0'}.*"
    return ""


def _check_keys(weights_file: Path, keys: list[str], config: Eagle3Config, layout: str = "safeailab") -> None:
    expected = expected_shapes3(config, layout)
    missing = sorted(set(expected) - set(keys))
    if missing:
        more = f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else ""
        raise Eagle3CheckpointError(
            f"{weights_file}: key {missing[0]!r} is missing{more}; an EAGLE-3 head in the {layout} layout needs "
            f"{sorted(expected)}; the file is incomplete or another layout (an EAGLE-1/2 head has layers.0.* without "
            f"hidden_norm and no lm_head): {_REDO}"
        )
    unexpected = sorted(set(keys) - set(expected) - _optional_keys(layout))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise Eagle3CheckpointError(
            f"{weights_file}: unexpected key {unexpected[0]!r}{more}{_unexpected_hint(unexpected[0], layout)}; an "
            f"EAGLE-3 head in the {layout} layout holds only {sorted(set(expected) | _optional_keys(layout))}"
        )
    if "t2d" in keys and "d2t" not in keys:
        raise Eagle3CheckpointError(f"{weights_file}: key 't2d' is present without 'd2t'; {_REDO}")
    if "d2t" not in keys and config.draft_vocab_size != config.vocab_size:
        raise Eagle3CheckpointError(
            f"{weights_file}: key 'd2t' is missing, but draft_vocab_size {config.draft_vocab_size} is smaller than "
            f"vocab_size {config.vocab_size}: the draft-to-target id map is needed; {_REDO}"
        )


def _check_tensors(weights_file: Path, config_file: Path, tensors: dict[str, Any], config: Eagle3Config,
                   layout: str = "safeailab") -> None:
    expected = expected_shapes3(config, layout)
    if "embed_tokens.weight" in tensors:
        expected["embed_tokens.weight"] = (config.vocab_size, config.hidden_size)
    for key in sorted(expected):
        tensor = tensors[key]
        check_floating(weights_file, key, tensor, Eagle3CheckpointError, _REDO)
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
    target_num_layers: int | None = None,
) -> Eagle3Head:
    """An Eagle3Head (prepared, eval, no grad) from a draft-head directory or hub id in either layout (a
    speculators config.json, or ``layers.0.*`` keys, selects the vLLM one), checked against the target's hidden and
    vocabulary sizes (and, given ``target_num_layers``, a speculators head's aux layers); ``dtype`` casts every
    float tensor (None: ``fc.weight``'s dtype)."""
    directory = resolve_model_dir(ref, allow_download=allow_download)
    # the EAGLE-1/2 config reader's refusals and the shared readers' become Eagle3CheckpointErrors
    return refusing_as(Eagle3CheckpointError, _load, directory, target_hidden_size, target_vocab_size, dtype, device,
                       target_num_layers)


def _load(directory: Path, target_hidden_size: int, target_vocab_size: int, dtype, device,
          target_num_layers: int | None = None) -> Eagle3Head:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise Eagle3CheckpointError(f"{directory}: no config.json; an EAGLE-3 head ships a one-layer Llama config.json "
                                    "or a speculators config.json")
    raw = read_json_object(config_file)
    marked = speculators.is_speculators_config(raw)
    config = (speculators.read_speculators_config(config_file, raw, target_num_layers) if marked
              else read_eagle3_config(config_file))
    check_target_fit(config_file, config, target_hidden_size, target_vocab_size, Eagle3CheckpointError,
                     "this EAGLE-3 head", "the head")
    weights_file = _find_weights_file(directory)
    keys, read = open_tensor_file(weights_file)
    layout = "speculators" if marked or speculators.uses_layer_names(keys) else "safeailab"
    _check_keys(weights_file, keys, config, layout)
    tensors = read(sorted(keys))
    _check_tensors(weights_file, config_file, tensors, config, layout)
    floats = sorted(expected_shapes3(config, layout)) + (["embed_tokens.weight"] if "embed_tokens.weight" in tensors else [])
    cast = cast_finite(weights_file, tensors, floats, dtype, device)
    with_map = "d2t" in tensors
    if with_map:
        cast["d2t"] = tensors["d2t"].to(device)
        cast["t2d"] = tensors["t2d"].to(device) if "t2d" in tensors else _t2d(tensors["d2t"], config.vocab_size).to(device)
    if layout == "speculators":
        cast = {speculators.to_head_key(key): tensor for key, tensor in cast.items()}
    return assign_weights(lambda: Eagle3Head(config, with_vocab_map=with_map, with_embed="embed_tokens.weight" in cast),
                          cast)


def _t2d(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    marked = torch.zeros(vocab, dtype=torch.bool)
    marked[torch.arange(d2t.numel()) + d2t.cpu()] = True
    return marked


def save_eagle3_head(
    out_dir: str | os.PathLike,
    head: Eagle3Head,
    *,
    format: Literal["bin", "safetensors"] | None = None,
    with_vocab_map: bool = True,
    layout: Literal["safeailab", "speculators"] = "safeailab",
    target_num_layers: int | None = None,
    verifier: str | None = None,
) -> Path:
    """Write ``head`` in ``layout`` under exactly its key names: SafeAILab's (``midlayer.*``; pytorch_model.bin by
    default) or the speculators one vLLM loads (``layers.0.*``, ``embed_tokens.weight`` when the head has its own,
    speculators' config.json with ``eagle_aux_hidden_state_layer_ids`` from ``target_num_layers`` and the
    ``verifier`` name; model.safetensors by default). ``with_vocab_map=False`` leaves out ``d2t``/``t2d`` (only for
    a draft vocabulary equal to the target's). Float tensors keep the head's dtype, ``d2t`` is int64, ``t2d`` bool.
    Atomic, as save_eagle_head."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {LAYOUTS}")
    format = format or ("bin" if layout == "safeailab" else "safetensors")
    if format not in ("bin", "safetensors"):
        raise ValueError(f"format={format!r}; expected 'bin' or 'safetensors'")
    config = head.config
    if not with_vocab_map and config.draft_vocab_size != config.vocab_size:
        raise ValueError(f"draft_vocab_size {config.draft_vocab_size} < vocab_size {config.vocab_size}: d2t is needed")
    if layout == "safeailab" and head.embed_tokens is not None:
        raise ValueError("this head has its own embed_tokens, which the SafeAILab layout cannot hold; "
                         "write it with layout='speculators'")
    state = head.state_dict()
    names = {key: key for key in expected_shapes3(config)}  # file key -> head key
    if layout == "speculators":
        own_embed = ["embed_tokens.weight"] if head.embed_tokens is not None else []
        names = {speculators.to_file_key(key): key for key in [*names, *own_embed]}
    # clone: fused q/k/v and gate/up are views of one tensor, and safetensors refuses shared storage
    tensors = {key: state[names[key]].detach().to("cpu").contiguous().clone() for key in sorted(names)}
    if with_vocab_map:
        d2t = head.d2t.cpu() if head.d2t is not None else torch.zeros(config.draft_vocab_size, dtype=torch.long)
        tensors.update(d2t=d2t.clone().long(), t2d=_t2d(d2t, config.vocab_size))
    dtype = str(tensors["fc.weight"].dtype).removeprefix("torch.")
    if layout == "speculators":
        aux = list(eagle3_aux_layers(target_num_layers)) if target_num_layers is not None else None
        raw = speculators.speculators_config_json(config, dtype=dtype, aux_layers=aux, verifier=verifier)
    else:
        raw = {**config.to_json(), "torch_dtype": dtype}
    return write_head_directory(out_dir, raw, tensors, format)
