"""Read Medusa heads from every published layout (old FasterDecoding, its "version 2", vLLM, Medusa-2
whole models) with strict key, shape and value checks, and write them atomically in either heads
layout (docs/checkpoints.md). The nn.Module they become is :mod:`specbench.medusa.heads`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file

from specbench.checkpoints.medusa_config import (
    MedusaCheckpointError,
    MedusaConfig,
    MedusaHeadsConfig,
    config_field,
    read_config_json,
)
from specbench.checkpoints.medusa_layouts import (
    BLOCK_BIAS,
    BLOCK_WEIGHT,
    KEY_SCHEMES,
    MODULE_SCHEME,
    VOCAB,
    HeadStructure,
    check_key_set,
    check_tensors,
    infer_structure,
    key_map,
)
from specbench.checkpoints.resolve import resolve_model_dir
from specbench.checkpoints.tensor_files import open_tensor_file
from specbench.checkpoints.validate import check_finite

# looked for in this order: a heads-only file before a whole model, safetensors before a pickle
WEIGHTS_FILES = (
    "medusa_lm_head.safetensors",
    "medusa_lm_head.pt",
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
# vLLM's loader strips this prefix from its own checkpoints' keys
_VLLM_PREFIX = "medusa_heads."


class MedusaCheckpointWarning(UserWarning):
    """The checkpoint loads, but its config disagrees with its weights (the weights win)."""


@dataclass
class MedusaCheckpoint:
    directory: Path
    weights_file: Path
    config_file: Path | None
    layout: str  # "fasterdecoding" | "fasterdecoding-v2" | "vllm" | "medusa2"
    # as the weights show it, not as config.json claims; vocab_size is 0 for version-2 heads read
    # without the target's vocab_size (they have no vocab projection to infer it from)
    config: MedusaHeadsConfig
    base_model_name_or_path: str | None
    state_dict: dict[str, torch.Tensor]  # MedusaHeads names: blocks.{h}.{l}.linear.weight|bias, lm_heads.{h}.weight
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading checkpoints


def _find_weights_file(directory: Path) -> Path:
    for name in WEIGHTS_FILES:
        if (directory / name).is_file():
            return directory / name
    present = sorted(p.name for p in directory.iterdir())
    raise MedusaCheckpointError(f"{directory}: no Medusa weights file; looked for {', '.join(WEIGHTS_FILES)}; the directory holds {present}")


def _detect_layout(weights_file: Path, keys: list[str], raw_config: dict[str, Any]) -> str:
    if weights_file.name.startswith("medusa_lm_head."):
        return "fasterdecoding"
    if any(key.startswith("medusa_head.") for key in keys):
        return "medusa2"
    if raw_config.get("model_type") == "medusa" or any(
        KEY_SCHEMES["vllm"].parse(key.removeprefix(_VLLM_PREFIX)) for key in keys
    ):
        return "vllm"
    raise MedusaCheckpointError(
        f"{weights_file}: no Medusa heads: none of the Medusa layouts' keys found (FasterDecoding's "
        "medusa_lm_head.safetensors|.pt file with '{h}.{l}.linear.weight', '{h}.{L}.weight'; vLLM's "
        "'blocks.{h}.layers.{l}.weight', 'lm_heads.{h}.weight'; Medusa-2's 'medusa_head.{h}.{l}.linear.weight'); "
        f"first keys: {sorted(keys)[:5]}{_other_proposer_hint(keys)}"
    )


def _other_proposer_hint(keys: list[str]) -> str:
    """What the keys look like instead, when they are another proposer's (an EAGLE draft head's fc + decoder layer)."""
    if "fc.weight" not in keys:
        return ""
    if any(key in ("d2t", "t2d") or key.startswith("midlayer.") for key in keys):
        return "; these are EAGLE-3 draft-head weights: use --proposer eagle3 (proposer name \"eagle3\" in a case file)"
    return ("; these look like EAGLE draft-head weights (fc.weight and a decoder layer): use --proposer eagle "
            "(proposer name \"eagle\" in a case file), or --proposer eagle3 for an EAGLE-3 head")


def _config_disagreements(
    layout: str, raw: dict[str, Any], config_file: Path, weights_file: Path, structure: HeadStructure, hidden: int, vocab: int
) -> list[str]:
    """Messages for every config value the weights contradict."""
    derived: list[tuple[str, Any, int]] = []  # (field name in the file, config value, value the weights show)
    if layout == "medusa2":
        # in a whole model's config, num_hidden_layers/hidden_size are the base model's: only the
        # medusa_* fields describe the heads
        for name, value in (("medusa_num_heads", structure.num_heads), ("medusa_num_layers", structure.num_layers)):
            if name in raw:
                derived.append((name, raw[name], value))
    else:
        for field_name, value in (("num_heads", structure.num_heads), ("num_hidden_layers", structure.num_layers)):
            found = config_field(raw, field_name, config_file)
            if found is not None:
                derived.append((found[0], found[1], value))
    if layout == "vllm":
        derived += [(name, raw[name], value) for name, value in (("hidden_size", hidden), ("vocab_size", vocab)) if name in raw]
    messages = [
        f"{config_file}: {name} = {claimed!r} but {weights_file} holds {actual} by its keys; using {actual} from the weights"
        for name, claimed, actual in derived
        if claimed != actual
    ]
    says_v2 = str(raw.get("version")) == "2"
    if layout == "fasterdecoding" and says_v2 and structure.has_vocab_projection:
        messages.append(f"{config_file}: version = '2' (no vocab projections) but {weights_file} holds them; keeping them")
    if layout == "fasterdecoding" and not says_v2 and not structure.has_vocab_projection:
        messages.append(
            f"{config_file}: no \"version\": \"2\", but {weights_file} holds no vocab projections; "
            "treating the heads as version 2 (they reuse the target's lm_head)"
        )
    if layout == "vllm" and structure.has_bias and not raw.get("medusa_fc_bias", False):
        messages.append(
            f"{config_file}: medusa_fc_bias is not set but {weights_file} holds block biases; keeping them "
            "(vLLM <= 0.32 would have dropped them)"
        )
    return messages


def _check_vllm_features(raw: dict[str, Any], config_file: Path) -> None:
    if raw.get("original_lm_head"):
        raise MedusaCheckpointError(f"{config_file}: original_lm_head = true (one lm_head shared by all heads) is not supported")
    truncated = raw.get("truncated_vocab_size")
    if truncated is not None and truncated != raw.get("vocab_size"):
        raise MedusaCheckpointError(
            f"{config_file}: truncated_vocab_size = {truncated} differs from vocab_size = {raw.get('vocab_size')}; "
            "heads over a truncated vocabulary (token_map) are not supported"
        )


def read_medusa_checkpoint(
    ref: str | os.PathLike, *, hidden_size: int | None = None, vocab_size: int | None = None, allow_download: bool | None = None
) -> MedusaCheckpoint:
    """Read a Medusa checkpoint directory (or hub id) of any known layout, strictly.

    Head and block counts come from the keys; a config.json that disagrees gives a
    MedusaCheckpointWarning. hidden_size/vocab_size (the target's) are checked against every tensor
    when given, else inferred from the first tensors and checked for consistency. Any missing,
    unexpected, mis-shaped or unreadable entry raises MedusaCheckpointError naming file and keys.
    """
    directory = resolve_model_dir(ref, allow_download=allow_download)
    weights_file = _find_weights_file(directory)
    notes: list[str] = []
    config_file: Path | None = directory / "config.json"
    if config_file.is_file():
        config_file, raw = read_config_json(config_file)
    else:
        config_file, raw = None, {}
        notes.append(f"{directory}: no config.json; head counts and sizes come from {weights_file.name} alone")

    all_keys, read = open_tensor_file(weights_file)
    layout = _detect_layout(weights_file, all_keys, raw)
    if layout == "medusa2":
        # the rest are the base model's own weights, which the target supplies
        file_keys = [key for key in all_keys if key.startswith("medusa_head.")]
    else:
        file_keys = all_keys
    # vLLM checkpoints may carry the prefix of the module they were saved from
    strip = _VLLM_PREFIX if layout == "vllm" and file_keys and all(k.startswith(_VLLM_PREFIX) for k in file_keys) else ""
    keys = [key.removeprefix(strip) for key in file_keys]
    if layout == "vllm" and config_file is not None:
        _check_vllm_features(raw, config_file)

    scheme = KEY_SCHEMES[layout]
    structure = infer_structure(scheme, keys, weights_file)
    if layout in ("fasterdecoding", "medusa2"):
        structure = replace(structure, has_bias=True)  # FasterDecoding's ResBlock Linear always has a bias
    elif raw.get("medusa_fc_bias"):
        structure = replace(structure, has_bias=True)
    expected = key_map(scheme, structure)
    check_key_set(weights_file, layout, structure, keys, expected)

    tensors = {key.removeprefix(strip): tensor for key, tensor in read([strip + key for key in expected]).items()}
    first_weight = next(iter(tensors.values()))
    basis = "the target's hidden_size/vocab_size" if hidden_size is not None and vocab_size is not None else "sizes inferred from the first tensors"
    if hidden_size is None:
        hidden_size = first_weight.shape[-1] if isinstance(first_weight, torch.Tensor) and first_weight.dim() else 0
    if vocab_size is None:
        vocab_key = scheme.key(VOCAB, 0, 0, structure.num_layers)
        vocab_tensor = tensors.get(vocab_key)
        vocab_size = vocab_tensor.shape[0] if isinstance(vocab_tensor, torch.Tensor) and vocab_tensor.dim() else 0
    check_tensors(weights_file, tensors, expected, hidden_size, vocab_size, f"hidden_size={hidden_size}, vocab_size={vocab_size} ({basis})")
    # NaN/inf heads would load and draft garbage silently (reads every head weight once)
    check_finite(
        ((key, tensors[key]) for key in sorted(expected)), str(weights_file), "key",
        "the heads are corrupt or diverged in training: re-download them, or re-train and re-export them",
    )

    if config_file is not None:
        notes += _config_disagreements(layout, raw, config_file, weights_file, structure, hidden_size, vocab_size)
    for note in notes:
        warnings.warn(note, MedusaCheckpointWarning, stacklevel=2)

    state_dict = {module_key: tensors[key] for key, (module_key, _) in expected.items()}
    if not structure.has_bias:
        # vLLM heads saved without medusa_fc_bias: a zero bias is exactly that block
        for h in range(structure.num_heads):
            for l in range(structure.num_layers):
                weight = state_dict[MODULE_SCHEME.key(BLOCK_WEIGHT, h, l)]
                state_dict[MODULE_SCHEME.key(BLOCK_BIAS, h, l)] = torch.zeros(hidden_size, dtype=weight.dtype)  # (H,)
    if layout == "fasterdecoding" and not structure.has_vocab_projection:
        layout = "fasterdecoding-v2"
    base_model = raw.get("base_model_name_or_path")
    return MedusaCheckpoint(
        directory=directory,
        weights_file=weights_file,
        config_file=config_file,
        layout=layout,
        config=MedusaHeadsConfig(
            num_heads=structure.num_heads,
            num_layers=structure.num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            has_vocab_projection=structure.has_vocab_projection,
        ),
        base_model_name_or_path=base_model if isinstance(base_model, str) else None,
        state_dict=state_dict,
        warnings=notes,
    )


def first_heads(checkpoint: MedusaCheckpoint, num_heads: int | None) -> tuple[MedusaHeadsConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of the checkpoint's first ``num_heads`` heads (all when None)."""
    config, state_dict = checkpoint.config, checkpoint.state_dict
    if num_heads is None:
        return config, state_dict
    if not 1 <= num_heads <= config.num_heads:
        raise MedusaCheckpointError(
            f"{checkpoint.weights_file}: num_heads={num_heads} asked for, but the file holds {config.num_heads} heads; "
            f"ask for 1..{config.num_heads}"
        )
    config = replace(config, num_heads=num_heads)
    keep = [module_key for module_key, _ in key_map(MODULE_SCHEME, _structure_of(config)).values()]
    return config, {module_key: state_dict[module_key] for module_key in keep}


def _structure_of(config: MedusaHeadsConfig) -> HeadStructure:
    return HeadStructure(config.num_heads, config.num_layers, config.has_vocab_projection, has_bias=True)


# ---------------------------------------------------------------- export


def write_medusa_checkpoint(
    config: MedusaHeadsConfig,
    module_state: dict[str, torch.Tensor],
    out_dir: str | os.PathLike,
    *,
    layout: Literal["fasterdecoding", "vllm"],
    base_model_name_or_path: str,
    weights_format: Literal["safetensors", "pt"] = "safetensors",
) -> Path:
    """Write heads (``module_state`` in MedusaHeads names) as an old FasterDecoding directory (config.json + medusa_lm_head.safetensors|.pt;
    heads without vocab projections get "version": "2") or a vLLM directory (model_type "medusa",
    model.safetensors, medusa_fc_bias so the biases are kept). Atomic: written into a temporary
    sibling directory, then renamed; out_dir must not exist or be empty."""
    if layout not in ("fasterdecoding", "vllm"):
        raise ValueError(f"layout={layout!r}; expected 'fasterdecoding' or 'vllm'")
    if weights_format not in ("safetensors", "pt"):
        raise ValueError(f"weights_format={weights_format!r}; expected 'safetensors' or 'pt'")
    if layout == "vllm" and weights_format != "safetensors":
        raise ValueError("the vLLM layout is written as model.safetensors; use weights_format='safetensors'")
    if layout == "vllm" and not config.has_vocab_projection:
        raise ValueError("vLLM's Medusa layout needs per-head lm_heads; version-2 heads (no vocab projection) export only as 'fasterdecoding'")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} already exists and is not an empty directory; choose a new path or remove it")

    mapping = key_map(KEY_SCHEMES[layout], _structure_of(config))
    # clone: FasterDecoding shares one block across indices, and safetensors refuses shared storage
    tensors = {key: module_state[module_key].detach().to("cpu").contiguous().clone() for key, (module_key, _) in mapping.items()}
    dtype = next(iter(tensors.values())).dtype

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; the result is an ordinary directory
        if layout == "fasterdecoding":
            raw_config: dict[str, Any] = {
                "base_model_name_or_path": base_model_name_or_path,
                "medusa_num_heads": config.num_heads,
                "medusa_num_layers": config.num_layers,
            }
            if not config.has_vocab_projection:
                raw_config["version"] = "2"
            (staging / "config.json").write_text(json.dumps(raw_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            if weights_format == "pt":
                torch.save(tensors, staging / "medusa_lm_head.pt")
            else:
                save_file(tensors, staging / "medusa_lm_head.safetensors", metadata={"format": "pt"})
        else:
            MedusaConfig(
                num_heads=config.num_heads,
                num_hidden_layers=config.num_layers,
                hidden_size=config.hidden_size,
                vocab_size=config.vocab_size,
                medusa_fc_bias=True,
                base_model_name_or_path=base_model_name_or_path,
                architectures=["MedusaModel"],
                dtype=dtype,
            ).save_pretrained(staging)
            save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
