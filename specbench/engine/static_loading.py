"""The static engine's model from a transformers model or a checkpoint directory, without transformers' model code."""

from __future__ import annotations

import torch

from specbench.engine.static_llama import EAGER_HINT, SUPPORTED_MODEL_TYPES, LlamaShape, StaticLlamaForCausalLM, UnsupportedModel


def module_from_hf_model(model) -> StaticLlamaForCausalLM:
    """Over a transformers ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM``: its weights are
    shared, except q/k/v and gate/up, which are fused into new tensors."""
    param = next(model.parameters())
    return StaticLlamaForCausalLM.from_state_dict(LlamaShape.from_config(model.config), model.state_dict(),
                                                  dtype=param.dtype, device=param.device, source=type(model).__name__)


def module_from_pretrained(ref, *, dtype: torch.dtype, device) -> tuple[StaticLlamaForCausalLM, object, str]:
    """(module, transformers config, source) of a checkpoint directory (or any reference ``resolve_model_dir``
    accepts), checked whole and finite; a model_type the engine cannot run is refused naming it."""
    from transformers import AutoConfig

    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.checkpoints.tensor_files import read_model_weights
    from specbench.checkpoints.validate import check_finite, check_target_dir, read_json_object

    directory = resolve_model_dir(ref)
    check_target_dir(directory)  # config.json and every weights file whole, one line naming what is not
    raw = read_json_object(directory / "config.json")
    if raw.get("model_type") not in SUPPORTED_MODEL_TYPES:  # before transformers, which may not know it either
        raise UnsupportedModel(
            f"{directory}: the static engine cannot run model_type {raw.get('model_type')!r}; it supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}; {EAGER_HINT}"
        )
    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    module = StaticLlamaForCausalLM.from_state_dict(LlamaShape.from_config(config), read_model_weights(directory),
                                                    dtype=dtype, device=torch.device(device), source=str(directory))
    check_finite(module.named_parameters(), str(directory), "parameter",
                 "the weights are corrupt or the model diverged: re-download or re-export it")
    return module, config, str(directory)
