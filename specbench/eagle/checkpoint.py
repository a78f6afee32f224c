"""EAGLE-1/EAGLE-2 draft heads to and from the published directory layout (config.json + pytorch_model.bin or
model.safetensors), read strictly: every refusal is one EagleCheckpointError naming the file, the key and the fix
(docs/eagle.md#errors). The readers, checks and errors the EAGLE-3 layouts share (checkpoint3.py and
layout_speculators.py) are here too."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, TypeVar

import torch
from safetensors.torch import save_file

from specbench.checkpoints.resolve import resolve_model_dir
from specbench.checkpoints.tensor_files import CheckpointError, open_tensor_file
from specbench.checkpoints.validate import check_finite, read_json_object
from specbench.eagle.draft_head import EagleConfig, EagleHead
from specbench.engine.static_llama import UnsupportedModel

# looked for in this order; the published drafts ship pytorch_model.bin
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")
EMBED_KEY = "embed_tokens.weight"
INPUT_NORM_KEY = "layers.0.input_layernorm.weight"
# keys only an EAGLE-3 draft (cnets.py) has
EAGLE3_PREFIXES = ("midlayer.", "d2t", "t2d", "norm.weight", "lm_head.weight")
_REDO = "re-download the draft head or re-export it"
_CORRUPT = "the head is corrupt or diverged in training: re-download it, or re-train and re-export it"
Head = TypeVar("Head", bound=EagleHead)
Loaded = TypeVar("Loaded")


class EagleCheckpointError(CheckpointError):
    """An EAGLE draft-head directory that does not describe a head this loader can build for the target."""


class Eagle3CheckpointError(EagleCheckpointError):
    """An EAGLE-3 draft-head directory that does not describe a head this loader can build for the target."""


# ---------------------------------------------------------------- config.json


def config_field(raw: dict, name: str, where: str, kind: type, default: Any = None, *, positive: bool = True,
                 error: type[Exception] = EagleCheckpointError,
                 missing: str = "{where}no {name!r}; an EAGLE-1/2 config.json is a Llama config that gives it") -> Any:
    """``raw[name]`` of type ``kind`` (ints accepted for floats; numbers positive unless ``positive`` is False), or
    ``default`` when absent; else ``error`` naming ``where`` (the file, and the table within it), the field and
    the value (``missing``, formatted with ``where`` and ``name``, when there is none)."""
    value = raw.get(name, default)
    if value is None:
        raise error(missing.format(where=where, name=name))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    numeric = positive and kind is not bool
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool) or (numeric and value <= 0):
        raise error(f"{where}{name} = {value!r}, expected a{' positive' if numeric else ''} {kind.__name__}")
    return value


def _rope(raw: dict, file: Path) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from the 4.x fields or transformers 5's ``rope_parameters``."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        scaling = rest if rest.get("rope_type", rest.get("type", "default")) != "default" else None
    else:
        theta, scaling = raw.get("rope_theta", 10000.0), raw.get("rope_scaling")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise EagleCheckpointError(f"{file}: rope_theta = {theta!r}, expected a positive number")
    if scaling is not None and not isinstance(scaling, dict):
        raise EagleCheckpointError(f"{file}: rope_scaling = {scaling!r}, expected an object or null")
    return float(theta), scaling


def read_eagle_config(file: Path) -> EagleConfig:
    """The EagleConfig a draft head's config.json describes, checked field by field."""
    raw = read_json_object(file)
    layers = raw.get("num_hidden_layers", 1)
    if layers != 1:
        raise EagleCheckpointError(
            f"{file}: num_hidden_layers = {layers!r}; the EAGLE-1/2 draft head is one decoder layer (cnets1.py), so "
            "this is not an EAGLE-1/2 head (an EAGLE-3 draft, or a whole model?)"
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise EagleCheckpointError(f"{file}: hidden_act = {act!r}; the draft layer's MLP is SwiGLU with silu only")
    heads = config_field(raw, "num_attention_heads", f"{file}: ", int)
    hidden = config_field(raw, "hidden_size", f"{file}: ", int)
    kv_heads = config_field(raw, "num_key_value_heads", f"{file}: ", int, heads)
    if hidden % heads or heads % kv_heads:
        raise EagleCheckpointError(
            f"{file}: hidden_size {hidden}, num_attention_heads {heads}, num_key_value_heads {kv_heads}: the hidden size "
            "must divide into the heads and the heads into the key/value heads"
        )
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise EagleCheckpointError(
            f"{file}: head_dim = {head_dim!r}, but an EAGLE-1/2 head splits hidden_size {hidden} into {heads} heads of "
            f"{hidden // heads}; remove head_dim or correct it"
        )
    theta, scaling = _rope(raw, file)
    config = EagleConfig(
        hidden_size=hidden,
        intermediate_size=config_field(raw, "intermediate_size", f"{file}: ", int),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=config_field(raw, "vocab_size", f"{file}: ", int),
        rms_norm_eps=config_field(raw, "rms_norm_eps", f"{file}: ", float, 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=config_field(raw, "max_position_embeddings", f"{file}: ", int, 2048),
        bias=config_field(raw, "bias", f"{file}: ", bool, True),
    )
    try:
        config.shape()
    except UnsupportedModel as error:
        raise EagleCheckpointError(f"{file}: the draft layer's rope settings are not supported ({error})") from None
    return config


def check_aux_flag(conf: dict, prefix: str) -> None:
    """Refuse a config whose ``eagle_config.use_aux_hidden_state`` is set and not true (``prefix`` names where)."""
    aux = conf.get("eagle_config") or {}
    if isinstance(aux, dict) and aux.get("use_aux_hidden_state", True) is not True:
        raise Eagle3CheckpointError(f"{prefix}eagle_config.use_aux_hidden_state = {aux['use_aux_hidden_state']!r}; an "
                                    "EAGLE-3 head fuses three target layers through fc")


# ---------------------------------------------------------------- keys and shapes


def expected_shapes(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Every key an EAGLE-1/2 weights file must hold, with its shape; ``embed_tokens.weight`` is optional."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {
        "fc.weight": (h, 2 * h),
        "layers.0.self_attn.q_proj.weight": (q, h),
        "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h),
        "layers.0.self_attn.o_proj.weight": (h, q),
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
        "layers.0.post_attention_layernorm.weight": (h,),
    }
    if config.bias:
        shapes["fc.bias"] = (h,)
    return shapes


def _check_keys(weights_file: Path, config_file: Path, keys: list[str], config: EagleConfig) -> None:
    eagle3 = sorted(k for k in keys if k.startswith(EAGLE3_PREFIXES))
    if eagle3:
        raise EagleCheckpointError(
            f"{weights_file}: key {eagle3[0]!r} belongs to an EAGLE-3 draft (cnets.py: midlayer, d2t/t2d, its own norm "
            "and lm_head), not to the EAGLE-1/2 layout this proposer reads; use an EAGLE-1/2 head (cnets1.py)"
        )
    if INPUT_NORM_KEY in keys:
        raise EagleCheckpointError(
            f"{weights_file}: key {INPUT_NORM_KEY!r} is present, but layer 0 of an EAGLE-1/2 draft has no "
            "input_layernorm: this is not an EAGLE-1/2 layout (an EAGLE-3 draft, or a full Llama layer?)"
        )
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(keys))
    if missing:
        hint = (f" (or set \"bias\": false in {config_file} if the head was trained without an fc bias)"
                if missing == ["fc.bias"] else "")
        more = f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else ""
        raise EagleCheckpointError(
            f"{weights_file}: key {missing[0]!r} is missing{more}; "
            f"an EAGLE-1/2 head needs {sorted(expected)}; the file is incomplete or another layout: {_REDO}{hint}"
        )
    unexpected = sorted(set(keys) - set(expected) - {EMBED_KEY})
    if unexpected:
        hint = f"; {config_file} says \"bias\": false, yet the file holds an fc bias" if unexpected[0] == "fc.bias" else ""
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise EagleCheckpointError(
            f"{weights_file}: unexpected key {unexpected[0]!r}{more}{hint}; an EAGLE-1/2 head holds only "
            f"{sorted(set(expected) | {EMBED_KEY})}: check that this is an EAGLE-1/2 draft head and that config.json "
            "is its own"
        )


def _check_shapes(weights_file: Path, config_file: Path, tensors: dict[str, Any], config: EagleConfig) -> None:
    expected = {**expected_shapes(config), EMBED_KEY: (config.vocab_size, config.hidden_size)}
    for key in sorted(tensors):
        tensor = tensors[key]
        check_floating(weights_file, key, tensor, EagleCheckpointError, _REDO)
        if tuple(tensor.shape) != expected[key]:
            hint = ""
            if key == "fc.weight" and tensor.dim() == 2 and tensor.shape[1] == 3 * tensor.shape[0]:
                hint = "; an fc over 3 x hidden is EAGLE-3's (three target layers fused), not EAGLE-1/2's"
            elif key == EMBED_KEY and tensor.dim() == 2:
                hint = f"; its vocabulary of {tensor.shape[0]} tokens does not fit the target's {config.vocab_size}"
            raise EagleCheckpointError(
                f"{weights_file}: key {key!r} has shape {tuple(tensor.shape)}, expected {expected[key]} from {config_file} "
                f"(hidden_size {config.hidden_size}, intermediate_size {config.intermediate_size}, "
                f"{config.num_attention_heads} heads, {config.num_key_value_heads} key/value heads){hint}; "
                f"is config.json the head's own? {_REDO}"
            )


def check_floating(weights_file: Path, key: str, tensor: Any, error: type[EagleCheckpointError], redo: str) -> None:
    """Refuse a value under ``key`` that is not a floating-point tensor (``error``, ending in ``redo``)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        what = f"a {tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) else f"a {type(tensor).__name__}"
        raise error(f"{weights_file}: key {key!r} holds {what}, expected a floating-point tensor; {redo}")


# ---------------------------------------------------------------- loading


def _find_weights_file(directory: Path) -> Path:
    for name in WEIGHTS_FILES:
        if (directory / name).is_file():
            return directory / name
    present = sorted(p.name for p in directory.iterdir())
    raise EagleCheckpointError(
        f"{directory}: no EAGLE weights file; looked for {', '.join(WEIGHTS_FILES)}; the directory holds {present}"
    )


def load_eagle_head(
    ref: str | os.PathLike,
    *,
    target_hidden_size: int,
    target_vocab_size: int,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    allow_download: bool | None = None,
) -> EagleHead:
    """An EagleHead (prepared, eval, no grad) from a draft-head directory or hub id, checked against the target's
    hidden and vocabulary sizes; ``dtype`` casts every tensor (None: ``fc.weight``'s dtype)."""
    directory = resolve_model_dir(ref, allow_download=allow_download)
    return refusing_as(EagleCheckpointError, _load, directory, target_hidden_size, target_vocab_size, dtype, device)


def refusing_as(error: type[EagleCheckpointError], load: Callable[..., Loaded], *args) -> Loaded:
    """``load(*args)``, with the shared readers' CheckpointErrors (unreadable file, NaN) and those of any other
    EAGLE reader raised again as ``error``: one class for every refusal of a loader."""
    try:
        return load(*args)
    except error:
        raise
    except CheckpointError as refusal:
        raise error(str(refusal)) from None


def check_target_fit(config_file: Path, config, hidden_size: int, vocab_size: int, error, head: str, published: str) -> None:
    """Refuse a head config whose hidden or vocabulary size is not the target's, naming both (``error`` raised)."""
    for what, theirs, ours in (("hidden_size", config.hidden_size, hidden_size), ("vocab_size", config.vocab_size, vocab_size)):
        if theirs != ours:
            raise error(f"{config_file}: {what} = {theirs}, but the target's is {ours}: {head} was trained for another "
                        f"target model; use {published} published for this target")


def _load(directory: Path, target_hidden_size: int, target_vocab_size: int, dtype, device) -> EagleHead:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise EagleCheckpointError(f"{directory}: no config.json; an EAGLE-1/2 head ships a one-layer Llama config.json; {_REDO}")
    config = read_eagle_config(config_file)
    check_target_fit(config_file, config, target_hidden_size, target_vocab_size, EagleCheckpointError,
                     "this draft head", "the EAGLE head")
    weights_file = _find_weights_file(directory)
    keys, read = open_tensor_file(weights_file)
    _check_keys(weights_file, config_file, keys, config)
    tensors = read(sorted(keys))
    _check_shapes(weights_file, config_file, tensors, config)
    cast = cast_finite(weights_file, tensors, sorted(tensors), dtype, device)
    return assign_weights(lambda: EagleHead(config, with_embed=EMBED_KEY in cast), cast)


def cast_finite(weights_file: Path, tensors: dict[str, torch.Tensor], keys: list[str], dtype: torch.dtype | None,
                device) -> dict[str, torch.Tensor]:
    """``tensors``' ``keys`` in ``dtype`` (None: ``fc.weight``'s) on ``device``, each refused, by key, where a value
    is not finite in the file or became inf on the cast."""
    check_finite(((key, tensors[key]) for key in keys), str(weights_file), "key", _CORRUPT)
    dtype = tensors["fc.weight"].dtype if dtype is None else dtype
    cast = {key: tensors[key].to(device=device, dtype=dtype) for key in keys}
    if any(tensors[key].dtype != dtype for key in keys):  # finite in the file; a narrower dtype can overflow
        check_finite(((key, cast[key]) for key in keys), str(weights_file), "key",
                     f"values beyond {dtype}'s range became inf on the cast: load the head in bfloat16 or float32")
    return cast


def assign_weights(build: Callable[[], Head], state: dict[str, torch.Tensor]) -> Head:
    """The head ``build`` makes, on the meta device, holding ``state``'s tensors themselves, prepared."""
    with torch.device("meta"):  # the real tensors are assigned, not copied into random ones
        head = build()
    head.load_state_dict(state, strict=True, assign=True)
    return head.prepare()


# ---------------------------------------------------------------- export


@contextlib.contextmanager
def _staged_directory(out_dir: Path) -> Iterator[Path]:
    """A temporary sibling directory that becomes ``out_dir`` in one rename when the block succeeds."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} already exists and is not an empty directory; choose a new path or remove it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; the result is an ordinary directory
        yield staging
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_eagle_head(
    out_dir: str | os.PathLike,
    head: EagleHead,
    *,
    format: Literal["bin", "safetensors"] = "bin",
    with_embed: bool = True,
) -> Path:
    """Write ``head`` in the published layout: config.json and pytorch_model.bin (``format="bin"``) or
    model.safetensors, under exactly the published key names; ``with_embed=False`` leaves out embed_tokens
    (the target's then serves). Atomic: written into a temporary sibling, then renamed."""
    if format not in ("bin", "safetensors"):
        raise ValueError(f"format={format!r}; expected 'bin' or 'safetensors'")
    if with_embed and head.embed_tokens is None:
        raise ValueError("this head has no embed_tokens of its own (it uses the target's); pass with_embed=False")
    state = head.state_dict()
    expected = set(expected_shapes(head.config)) | ({EMBED_KEY} if with_embed else set())
    # clone: fused q/k/v and gate/up are views of one tensor, and safetensors refuses shared storage
    tensors = {key: state[key].detach().to("cpu").contiguous().clone() for key in sorted(expected)}
    config = {**head.config.to_json(), "torch_dtype": str(tensors["fc.weight"].dtype).removeprefix("torch.")}
    return write_head_directory(out_dir, config, tensors, format)


def write_head_directory(out_dir: str | os.PathLike, config: dict, tensors: dict[str, torch.Tensor],
                         format: Literal["bin", "safetensors"]) -> Path:
    """``out_dir`` holding ``config`` as config.json and ``tensors`` as pytorch_model.bin (``format="bin"``) or
    model.safetensors; atomic: written into a temporary sibling, then renamed."""
    out_dir = Path(out_dir)
    with _staged_directory(out_dir) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if format == "bin":
            torch.save(tensors, staging / "pytorch_model.bin")
        else:
            save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
    return out_dir
