"""``specbench zoo synth``: the random decisive weights and Medusa heads; what they are and why, and the command line, are in
specbench/zoo/synth_command.py (light to import, so that `specbench --help` loads no torch)."""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.zoo.synth_command import MEDUSA_1_VICUNA_7B_TOP1, SHAPES, VICUNA_7B_SHAPE  # noqa: F401 - found here too

from specbench.io.atomic_write import write_text_atomic
from specbench.zoo import synth_proposers
from specbench.zoo.synth_proposers import publish_directory as _publish
from specbench.zoo.acceptance_profiles import (DRAFT_QWEN3_K3, EAGLE2_VICUNA_7B, EAGLE3_LLAMA_31_8B_K3, check_profile,
                                               proposer_profile_record)

# the draft model beside a target other than the 7B: one small layer on the target's vocabulary (sqrt(64) = 8 keeps
# the margins decisive, as the tiny target's)
TINY_DRAFT_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=4, head_dim=16)
# FasterDecoding/medusa-vicuna-7b-v1.3's config.json, head count wrong as published (docs/checkpoints.md)
UPSTREAM_MEDUSA_CONFIG = {"medusa_num_heads": 2, "medusa_num_layers": 1, "transformers_version": "4.31.0"}
# 32 random 7B layers add residual noise of rms ~15 (each adds ~2.5, normalised inputs); 100 dominates it.
# 16 random 1B layers add less (~1 each, rms ~4 in all: narrower matrices, a quarter of the v heads)
DECISIVE_EMBED_STD = 100.0
NUM_SPECIAL_TOKENS = 3  # <unk>, <s>, </s>: never a successor, so EOS does not end the synthetic text
UNK_TOKEN = 0  # where a profile head sends the last of its wrong tokens (never a right answer)


def _random_(tensor: torch.Tensor, std: float, generator: torch.Generator) -> None:
    tensor.normal_(0.0, std, generator=generator)


def build_target(*, shape: dict, dtype: torch.dtype, device: str, seed: int) -> tuple[LlamaForCausalLM, torch.Tensor]:
    """Random Llama weights (std 0.02, Llama's initializer range) made decisive; returns (model, cycle order)."""
    config = LlamaConfig(**shape, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, dtype=str(dtype).split(".")[1])
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                _random_(parameter, config.initializer_range, generator)
        order = _make_decisive(model, generator)
    return model, order


def _save_model(model: LlamaForCausalLM, out_dir: Path, name: str = "target") -> Path:
    """``model`` saved with save_pretrained as ``out_dir/name``, in one rename."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir))
    model.save_pretrained(staging)
    return _publish(staging, out_dir, name)


def synth_target(out_dir: Path, *, shape: dict, dtype: torch.dtype, device: str, seed: int) -> Path:
    """Random decisive Llama weights, saved with save_pretrained as ``out_dir/target``."""
    model, _ = build_target(shape=shape, dtype=dtype, device=device, seed=seed)
    return _save_model(model, out_dir)


def _make_decisive(model: LlamaForCausalLM, generator: torch.Generator) -> torch.Tensor:
    """Large random embeddings; lm_head row of token order[i+1] = embedding of order[i] (see the module doc).
    Returns the cycle ``order`` (N,): the ordinary tokens, each followed by its successor."""
    embed = model.get_input_embeddings().weight  # (V, H)
    head = model.get_output_embeddings().weight  # (V, H)
    vocab, hidden = embed.shape
    _random_(embed, DECISIVE_EMBED_STD, generator)
    order = torch.randperm(vocab - NUM_SPECIAL_TOKENS, generator=generator, device=generator.device) + NUM_SPECIAL_TOKENS
    # after the final RMSNorm the hidden state is ~embed[t] / std (unit rms): dividing by std * sqrt(H)
    # gives the successor a logit of ~sqrt(H) and every other token ~N(0, 1)
    head[order.roll(-1)] = embed[order] / (DECISIVE_EMBED_STD * math.sqrt(hidden))
    return order


def _write_heads(out_dir: Path, name: str, state: dict[str, torch.Tensor], base: str) -> Path:
    """``medusa_lm_head.pt`` with the old keys beside the upstream config.json (2 heads claimed, no model_type)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir))
    torch.save(state, staging / "medusa_lm_head.pt")
    config = {"base_model_name_or_path": base, **UPSTREAM_MEDUSA_CONFIG}
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return _publish(staging, out_dir, name)


def synth_medusa(out_dir: Path, *, base: str, hidden: int, vocab: int, num_heads: int, num_layers: int,
                 dtype: torch.dtype, device: str, seed: int) -> Path:
    """Random Medusa-1 heads with non-zero biases as ``out_dir/medusa`` (upstream layout)."""
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    state = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            weight = torch.empty(hidden, hidden, device=device, dtype=dtype)  # (H, H)
            bias = torch.empty(hidden, device=device, dtype=dtype)  # (H,)
            _random_(weight, 0.02, generator)
            _random_(bias, 0.02, generator)
            state[f"{h}.{layer}.linear.weight"] = weight.cpu()
            state[f"{h}.{layer}.linear.bias"] = bias.cpu()
        projection = torch.empty(vocab, hidden, device=device, dtype=dtype)  # (V, H)
        _random_(projection, 0.02, generator)
        state[f"{h}.{num_layers}.weight"] = projection.cpu()
    return _write_heads(out_dir, "medusa", state, base)


def num_wrong_tokens(accuracy: float, num_ordinary: int) -> int:
    """How many of the ordinary tokens a head of top-1 ``accuracy`` gets wrong."""
    return round((1.0 - accuracy) * num_ordinary)


def profile_projection(embed: torch.Tensor, order: torch.Tensor, *, steps: int, accuracy: float,
                       generator: torch.Generator) -> torch.Tensor:
    """(V, H) vocab projection whose top-1 for token t is succ^steps(t) except for num_wrong_tokens(accuracy) t."""
    vocab, hidden = embed.shape
    n = order.numel()
    targets = order.roll(-steps).clone()  # (N,): targets[i] = succ^steps(order[i]), the row that makes order[i] right
    wrong = torch.randperm(n, generator=generator, device=generator.device)[:num_wrong_tokens(accuracy, n)]  # (W,)
    if wrong.numel():
        # each wrong token takes the next wrong token's right row, the last takes <unk>'s: all wrong, rows distinct
        unk = torch.tensor([UNK_TOKEN], device=targets.device)
        targets[wrong] = torch.cat([targets[wrong[1:]], unk])
    projection = torch.zeros(vocab, hidden, device=embed.device, dtype=embed.dtype)  # unused rows: logit 0
    # as the lm_head: the chosen row gets a logit of ~sqrt(H), every other ordinary row ~N(0, 1)
    projection[targets] = embed[order] / (DECISIVE_EMBED_STD * math.sqrt(hidden))
    return projection


def synth_medusa_profile(out_dir: Path, *, base: str, embed: torch.Tensor, order: torch.Tensor,
                         accuracies: list[float], seed: int) -> Path:
    """Medusa-1 heads of known top-1 accuracy (module doc) as ``out_dir/medusa-profile`` (upstream layout)."""
    generator = torch.Generator(device=embed.device).manual_seed(seed + 2)
    hidden = embed.shape[1]
    state = {}
    for h, accuracy in enumerate(accuracies):
        zeros = torch.zeros(hidden, hidden, dtype=embed.dtype)  # (H, H): x + SiLU(0 x + 0) = x
        state[f"{h}.0.linear.weight"] = zeros
        state[f"{h}.0.linear.bias"] = torch.zeros(hidden, dtype=embed.dtype)  # (H,)
        projection = profile_projection(embed, order, steps=h + 2, accuracy=accuracy, generator=generator)
        state[f"{h}.1.weight"] = projection.cpu()
    return _write_heads(out_dir, "medusa-profile", state, base)


def head_accuracies(profile, num_heads: int) -> list[float]:
    """One accuracy per head: ``profile``'s last entry repeats for heads past its end."""
    profile = [float(p) for p in profile]
    if not profile or len(profile) > num_heads:
        raise ValueError(f"--head-accuracy: give 1 to {num_heads} accuracies (--num-medusa-heads), got {len(profile)}")
    bad = [p for p in profile if not 0.0 <= p <= 1.0]
    if bad:
        raise ValueError(f"--head-accuracy: accuracies must lie in [0, 1], got {bad[0]}")
    return profile + [profile[-1]] * (num_heads - len(profile))


def profile_record(accuracies: list[float], num_ordinary: int) -> dict:
    """What synth_record.json says about the profile heads: requested, built, and the chain's expected acceptance."""
    built = [1.0 - num_wrong_tokens(p, num_ordinary) / num_ordinary for p in accuracies]
    return {"head_accuracy": accuracies, "head_top1_accuracy": [round(p, 6) for p in built],
            "expected_per_position_acceptance": [round(math.prod(built[: i + 1]), 6) for i in range(len(built))]}


def _resolve_shape(shape: dict | str | None) -> tuple[str, dict]:
    """(name, full shape dict): a name of SHAPES, or a dict of overrides of the 7B shape (named if it is one)."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown synthetic shape {shape!r}; expected one of {sorted(SHAPES)}")
        return shape, {**VICUNA_7B_SHAPE, **SHAPES[shape]}
    full = {**VICUNA_7B_SHAPE, **(shape or {})}
    named = [name for name, known in SHAPES.items() if {**VICUNA_7B_SHAPE, **known} == full]
    return (named[0] if named else "custom"), full


def synth_proposer_profiles(out: Path, model: LlamaForCausalLM, order: torch.Tensor, *, shape_name: str, shape: dict,
                            profiles: dict[str, tuple[float, ...]], dtype: torch.dtype, device: str, seed: int) -> dict:
    """``OUT/eagle-profile``, ``OUT/eagle3-profile`` and ``OUT/draft-profile`` (synth_proposers.py), each following its
    profile of ``profiles`` (keyed eagle, eagle3, draft) along the target's cycle ``order``; their record entries."""
    embed = model.get_input_embeddings().weight.detach()  # (V, H)
    vocab, entries = shape["vocab_size"], {}
    for key, build, save in (("eagle", synth_proposers.eagle_profile_head, synth_proposers.save_eagle_profile),
                             ("eagle3", synth_proposers.eagle3_profile_head, synth_proposers.save_eagle3_profile)):
        misses = synth_proposers.ProfileMisses(order, profiles[key], vocab)
        head = build(embed, DECISIVE_EMBED_STD, shape, misses, dtype=dtype, seed=seed)
        record = proposer_profile_record(profiles[key], order.numel())
        entries[f"{key}_profile"] = {"path": str(save(out, head)), **record}
    draft_name, draft_shape = draft_shape_for(shape_name, shape)
    draft, _ = build_target(shape=draft_shape, dtype=dtype, device=device, seed=seed + 5)
    misses = synth_proposers.ProfileMisses(order, profiles["draft"], vocab)
    synth_proposers.draft_profile_model(draft, DECISIVE_EMBED_STD, misses)
    entries["draft_profile"] = {"path": str(_save_model(draft, out, "draft-profile")), "shape_name": draft_name,
                                "shape": draft_shape, "num_parameters": sum(p.numel() for p in draft.parameters()),
                                **proposer_profile_record(profiles["draft"], order.numel())}
    return entries


def draft_shape_for(shape_name: str, shape: dict) -> tuple[str, dict]:
    """(name, shape) of the draft model for a target: Llama-3.2-1B-like beside the 7B, else a one-layer miniature;
    always the target's vocabulary."""
    if shape_name == "7b":
        return "1b", {**SHAPES["1b"], "vocab_size": shape["vocab_size"]}
    return "tiny-draft", {**shape, **TINY_DRAFT_SHAPE}


def synth(out_dir: str | os.PathLike, *, shape: dict | str | None = None, num_medusa_heads: int = 5,
          dtype: str = "bfloat16", device: str = "cuda", seed: int = 0,
          head_accuracy=MEDUSA_1_VICUNA_7B_TOP1, eagle_acceptance=EAGLE2_VICUNA_7B,
          eagle3_acceptance=EAGLE3_LLAMA_31_8B_K3, draft_acceptance=DRAFT_QWEN3_K3) -> dict:
    """Write ``OUT/target``, ``OUT/medusa``, ``OUT/medusa-profile`` and the profile EAGLE-2 and EAGLE-3 heads and
    draft model; returns a record of what was written (also ``OUT/synth_record.json``, replaced in one rename)."""
    out = Path(out_dir)
    shape_name, shape = _resolve_shape(shape)
    accuracies = head_accuracies(head_accuracy, num_medusa_heads)
    profiles = {"eagle": check_profile(eagle_acceptance, "--eagle-acceptance"),
                "eagle3": check_profile(eagle3_acceptance, "--eagle3-acceptance"),
                "draft": check_profile(draft_acceptance, "--draft-acceptance")}
    out.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    started = time.perf_counter()
    model, order = build_target(shape=shape, dtype=torch_dtype, device=device, seed=seed)
    target = _save_model(model, out)
    medusa = synth_medusa(out, base=str(target), hidden=shape["hidden_size"], vocab=shape["vocab_size"],
                          num_heads=num_medusa_heads, num_layers=1, dtype=torch_dtype, device=device, seed=seed)
    profile = synth_medusa_profile(out, base=str(target), embed=model.get_input_embeddings().weight.detach(),
                                   order=order, accuracies=accuracies, seed=seed)
    proposers = synth_proposer_profiles(out, model, order, shape_name=shape_name, shape=shape, profiles=profiles,
                                        dtype=torch_dtype, device=device, seed=seed)
    record = {"target": str(target), "medusa": str(medusa), "medusa_profile": str(profile), "shape_name": shape_name,
              "shape": shape, "num_medusa_heads": num_medusa_heads, **profile_record(accuracies, order.numel()),
              **proposers, "dtype": dtype, "seed": seed, "seconds": round(time.perf_counter() - started, 1)}
    write_text_atomic(out / "synth_record.json", json.dumps(record, indent=2) + "\n")  # the old record or the new
    return record


def run(args: argparse.Namespace) -> int:
    record = synth(args.out_dir, shape=args.shape, num_medusa_heads=args.num_medusa_heads, dtype=args.dtype,
                   device=args.device, seed=args.seed, head_accuracy=args.head_accuracy,
                   eagle_acceptance=args.eagle_acceptance, eagle3_acceptance=args.eagle3_acceptance,
                   draft_acceptance=args.draft_acceptance)
    print(json.dumps(record, indent=2))
    return 0
