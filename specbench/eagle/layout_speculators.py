"""The EAGLE-3 layout vLLM loads (speculators' config.json, ``layers.0.*`` keys), mapped onto Eagle3Head (docs/eagle.md#vllm-speculators-layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbench.eagle.checkpoint import Eagle3CheckpointError, _rope, check_aux_flag, config_field
from specbench.eagle.eagle3 import NUM_AUX_LAYERS, Eagle3Config, eagle3_aux_layers
from specbench.engine.static_llama import UnsupportedModel

# the config.json field that makes a directory a speculators checkpoint (vLLM routes on it too)
MARKER = "speculators_model_type"
# the decoder layer's key prefix in this layout, and the one Eagle3Head (SafeAILab's cnets.py) uses
LAYER_PREFIX, HEAD_LAYER_PREFIX = "layers.0.", "midlayer."
EMBED_KEY = "embed_tokens.weight"
# speculators flags that add norms Eagle3Head has no place for: refused when true
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
# transformer_layer_config fields that change the layer's weights or form: refused unless they hold this value
FIXED_LAYER_FIELDS = {"num_hidden_layers": 1, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
_ABSENT = object()


def is_speculators_config(raw: dict) -> bool:
    """Whether a parsed config.json is speculators' (it has ``speculators_model_type``)."""
    return MARKER in raw


def uses_layer_names(keys) -> bool:
    """Whether a weights file names the decoder layer ``layers.0.*`` (vLLM's and speculators' spelling) rather than
    ``midlayer.*`` (SafeAILab's); a file holding both is SafeAILab's, and its ``layers.0.*`` keys are unexpected."""
    keys = list(keys)
    return any(k.startswith(LAYER_PREFIX) for k in keys) and not any(k.startswith(HEAD_LAYER_PREFIX) for k in keys)


def to_file_key(head_key: str) -> str:
    """The key this layout stores Eagle3Head's parameter ``head_key`` under."""
    return LAYER_PREFIX + head_key.removeprefix(HEAD_LAYER_PREFIX) if head_key.startswith(HEAD_LAYER_PREFIX) else head_key


def to_head_key(file_key: str) -> str:
    """Eagle3Head's parameter name for this layout's ``file_key``."""
    return HEAD_LAYER_PREFIX + file_key.removeprefix(LAYER_PREFIX) if file_key.startswith(LAYER_PREFIX) else file_key


def _get(raw: dict, name: str, where: str, kind: type, default: Any = None) -> Any:
    """``raw[name]`` held to ``kind`` (checkpoint.config_field), or ``default`` when absent."""
    return config_field(raw, name, where, kind, default, error=Eagle3CheckpointError,
                        missing="{where}{name}: missing; a speculators EAGLE-3 config.json gives it")


def read_speculators_config(file: Path, raw: dict, target_num_layers: int | None = None) -> Eagle3Config:
    """The Eagle3Config of a speculators config.json (``raw``, already parsed): the Llama layer's shape from
    ``transformer_layer_config``, the EAGLE-3 fields from the top level; every feature Eagle3Head cannot
    represent is refused, naming the field and its value."""
    top, kind = f"{file}: ", raw.get(MARKER)
    if kind != "eagle3":
        raise Eagle3CheckpointError(
            f"{top}{MARKER} = {kind!r}; this loader reads speculators' 'eagle3' heads only (an 'eagle' head is "
            "EAGLE-1/2, whose speculators layout specbench does not read; others are other algorithms)")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise Eagle3CheckpointError(f"{top}transformer_layer_config = {layer!r}, expected an object (the draft layer's "
                                    "Llama config)")
    where = f"{file}: transformer_layer_config."
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise Eagle3CheckpointError(f"{where}model_type = {model_type!r}; only a Llama draft layer is supported (a "
                                    "qwen3 layer adds q/k norms that Eagle3Head does not have)")
    for name, wanted in FIXED_LAYER_FIELDS.items():
        value = layer.get(name, wanted if name != "num_hidden_layers" else _ABSENT)
        if value is _ABSENT:
            raise Eagle3CheckpointError(f"{where}{name}: missing; a speculators EAGLE-3 config.json gives it")
        if value != wanted or isinstance(value, bool) != isinstance(wanted, bool):
            raise Eagle3CheckpointError(f"{where}{name} = {value!r}; Eagle3Head supports only {wanted!r} (one decoder "
                                        "layer, SwiGLU with silu, no attention or MLP biases)")
    for name in UNSUPPORTED_FLAGS:
        if raw.get(name, False) is not False:
            raise Eagle3CheckpointError(f"{top}{name} = {raw[name]!r}; Eagle3Head has no such norm (an EAGLE-3.1 head): "
                                        "only heads with it false or absent load")
    for conf, prefix in ((raw, top), (layer, where)):
        check_aux_flag(conf, prefix)
    hidden, heads = _get(layer, "hidden_size", where, int), _get(layer, "num_attention_heads", where, int)
    kv_heads = _get(layer, "num_key_value_heads", where, int, heads)
    if hidden % heads or heads % kv_heads:
        raise Eagle3CheckpointError(f"{where}hidden_size {hidden}, num_attention_heads {heads}, num_key_value_heads "
                                    f"{kv_heads}: the hidden size must divide into the heads and the heads into the "
                                    "key/value heads")
    head_dim = layer.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise Eagle3CheckpointError(f"{where}head_dim = {head_dim!r}, but Eagle3Head splits hidden_size {hidden} into "
                                    f"{heads} heads of {hidden // heads}")
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != hidden:
        raise Eagle3CheckpointError(f"{top}target_hidden_size = {target_hidden!r} differs from transformer_layer_config."
                                    f"hidden_size = {hidden}; heads whose fc reads a target of another width are not "
                                    "supported")
    vocab = _get(layer, "vocab_size", where, int)
    draft_vocab = _get(raw, "draft_vocab_size", top, int, vocab)
    if draft_vocab > vocab:
        raise Eagle3CheckpointError(f"{top}draft_vocab_size = {draft_vocab} exceeds transformer_layer_config.vocab_size "
                                    f"= {vocab}; the draft vocabulary is a subset of the target's")
    _check_aux_layers(top, raw.get("eagle_aux_hidden_state_layer_ids"), target_num_layers)
    theta, scaling = _rope(layer, f"{file}: transformer_layer_config")
    config = Eagle3Config(
        hidden_size=hidden, intermediate_size=_get(layer, "intermediate_size", where, int), num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, rms_norm_eps=_get(layer, "rms_norm_eps", where, float, 1e-6),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=_get(layer, "max_position_embeddings", where, int, 2048),
        draft_vocab_size=draft_vocab,
        # vLLM's speculators adapter reads an absent flag as true
        norm_before_residual=_get(raw, "norm_before_residual", top, bool, True),
    )
    try:
        config.shape()
    except UnsupportedModel as error:
        raise Eagle3CheckpointError(f"{where}rope: the draft layer's rope settings are not supported ({error})") from None
    return config


def _check_aux_layers(top: str, ids, target_num_layers: int | None) -> None:
    """The target layers the head was trained on must be the ones specbench feeds it, ``eagle3_aux_layers(L)``:
    checked against the target's L when known, else against the form (2, L // 2, L - 3) for some L."""
    if ids is None or ids == []:
        return
    field = f"{top}eagle_aux_hidden_state_layer_ids = {ids!r}"
    if not isinstance(ids, list) or len(ids) != NUM_AUX_LAYERS or not all(type(i) is int and i >= 0 for i in ids):
        raise Eagle3CheckpointError(f"{field}; Eagle3Head's fc fuses exactly {NUM_AUX_LAYERS} target layers")
    if target_num_layers is not None:
        wanted = list(eagle3_aux_layers(target_num_layers))
        if ids != wanted:
            raise Eagle3CheckpointError(f"{field}, but specbench feeds layers {wanted} of this {target_num_layers}-layer "
                                        "target (eagle3_aux_layers): the head was trained on other layers")
    elif not any(list(eagle3_aux_layers(n)) == ids for n in range(1, max(ids) + 4)):
        raise Eagle3CheckpointError(f"{field}; specbench feeds the layers (2, L // 2, L - 3) of an L-layer target "
                                    "(eagle3_aux_layers), which these are not for any L")


def speculators_config_json(config: Eagle3Config, *, dtype: str, aux_layers: list[int] | None = None,
                            verifier: str | None = None) -> dict:
    """config.json in speculators' form for ``config``: the Llama layer under ``transformer_layer_config``, the
    EAGLE-3 fields and ``speculators_config`` (one greedy proposal method, the verifier) at the top level."""
    layer = {k: v for k, v in config.to_json().items() if k not in ("architectures", "draft_vocab_size",
                                                                     "norm_before_residual")}
    layer.update(architectures=["LlamaForCausalLM"], head_dim=config.head_dim, attention_bias=False, mlp_bias=False,
                 tie_word_embeddings=False, torch_dtype=dtype)
    return {
        "architectures": ["Eagle3Speculator"],
        MARKER: "eagle3",
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": config.norm_before_residual,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux_layers,
        **{name: False for name in UNSUPPORTED_FLAGS},
        "torch_dtype": dtype,
    }
