"""``specbench zoo synth``: write a Vicuna-7B-shaped Llama with random weights and 5 random Medusa
heads in the exact upstream layout, so the GPU tier exercises 7B-scale loading and decoding
without a download. Random weights make acceptance meaningless: cases built on it never gate it.

The weights are random but *decisive*: with i.i.d. N(0, 0.02) weights everywhere, the 32,000 logits
are near-ties and bf16's different rounding for a k-token verification flips the greedy argmax
within a few dozen tokens (measured on the H200: bf16 tree-63 match fraction 0.19, and an oracle
proposing the plain greedy continuation reached MAL 1.06 of a possible 4). So the embeddings are
drawn large (std DECISIVE_EMBED_STD, dominating the residual stream) and the lm_head maps each
ordinary token to its successor on a random cycle over the vocabulary (top logit ~sqrt(hidden),
the rest ~N(0, 1)). Every matrix keeps its shape, dtype and cost; greedy decoding just has margins
that rounding cannot flip, so bf16 lossless checks and oracle speed figures mean something.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# lmsys/vicuna-7b-v1.3's architecture (Llama-7B)
VICUNA_7B_SHAPE = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
)
# FasterDecoding/medusa-vicuna-7b-v1.3's config.json, head count wrong as published (docs/checkpoints.md)
UPSTREAM_MEDUSA_CONFIG = {"medusa_num_heads": 2, "medusa_num_layers": 1, "transformers_version": "4.31.0"}
# 32 random layers add residual noise of rms ~15 (each adds ~2.5, normalised inputs); 100 dominates it
DECISIVE_EMBED_STD = 100.0
NUM_SPECIAL_TOKENS = 3  # <unk>, <s>, </s>: never a successor, so EOS does not end the synthetic text


def _random_(tensor: torch.Tensor, std: float, generator: torch.Generator) -> None:
    tensor.normal_(0.0, std, generator=generator)


def synth_target(out_dir: Path, *, shape: dict, dtype: torch.dtype, device: str, seed: int) -> Path:
    """Random Llama weights (std 0.02, Llama's initializer range), saved with save_pretrained."""
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
        _make_decisive(model, generator)
    staging = Path(tempfile.mkdtemp(prefix=".target.", dir=out_dir))
    model.save_pretrained(staging)
    final = out_dir / "target"
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def _make_decisive(model: LlamaForCausalLM, generator: torch.Generator) -> None:
    """Large random embeddings; lm_head row of token order[i+1] = embedding of order[i] (see the module doc)."""
    embed = model.get_input_embeddings().weight  # [V, H]
    head = model.get_output_embeddings().weight  # [V, H]
    vocab, hidden = embed.shape
    _random_(embed, DECISIVE_EMBED_STD, generator)
    order = torch.randperm(vocab - NUM_SPECIAL_TOKENS, generator=generator, device=generator.device) + NUM_SPECIAL_TOKENS
    # after the final RMSNorm the hidden state is ~embed[t] / std (unit rms): dividing by std * sqrt(H)
    # gives the successor a logit of ~sqrt(H) and every other token ~N(0, 1)
    head[order.roll(-1)] = embed[order] / (DECISIVE_EMBED_STD * math.sqrt(hidden))


def synth_medusa(out_dir: Path, *, base: str, hidden: int, vocab: int, num_heads: int, num_layers: int,
                 dtype: torch.dtype, device: str, seed: int) -> Path:
    """Medusa-1 heads with non-zero biases as ``medusa_lm_head.pt`` with the old keys, beside the
    upstream config.json (which claims 2 heads and has no model_type)."""
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    state = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            weight = torch.empty(hidden, hidden, device=device, dtype=dtype)
            bias = torch.empty(hidden, device=device, dtype=dtype)
            _random_(weight, 0.02, generator)
            _random_(bias, 0.02, generator)
            state[f"{h}.{layer}.linear.weight"] = weight.cpu()
            state[f"{h}.{layer}.linear.bias"] = bias.cpu()
        projection = torch.empty(vocab, hidden, device=device, dtype=dtype)
        _random_(projection, 0.02, generator)
        state[f"{h}.{num_layers}.weight"] = projection.cpu()
    staging = Path(tempfile.mkdtemp(prefix=".medusa.", dir=out_dir))
    torch.save(state, staging / "medusa_lm_head.pt")
    config = {"base_model_name_or_path": base, **UPSTREAM_MEDUSA_CONFIG}
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    final = out_dir / "medusa"
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def synth(out_dir: str | os.PathLike, *, shape: dict | None = None, num_medusa_heads: int = 5, dtype: str = "bfloat16",
          device: str = "cuda", seed: int = 0) -> dict:
    """Write ``OUT/target`` and ``OUT/medusa``; returns a record of what was written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = {**VICUNA_7B_SHAPE, **(shape or {})}
    torch_dtype = getattr(torch, dtype)
    started = time.perf_counter()
    target = synth_target(out, shape=shape, dtype=torch_dtype, device=device, seed=seed)
    medusa = synth_medusa(out, base=str(target), hidden=shape["hidden_size"], vocab=shape["vocab_size"],
                          num_heads=num_medusa_heads, num_layers=1, dtype=torch_dtype, device=device, seed=seed)
    record = {"target": str(target), "medusa": str(medusa), "shape": shape, "num_medusa_heads": num_medusa_heads,
              "dtype": dtype, "seed": seed, "seconds": round(time.perf_counter() - started, 1)}
    (out / "synth_record.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="where target/ and medusa/ are written")
    parser.add_argument("--device", default="cuda", help="where the random weights are drawn (cuda is much faster)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-medusa-heads", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="a miniature of the same layout (tests, CPU)")


TINY_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)


def run(args: argparse.Namespace) -> int:
    record = synth(args.out_dir, shape=TINY_SHAPE if args.tiny else None, num_medusa_heads=args.num_medusa_heads,
                   dtype=args.dtype, device=args.device, seed=args.seed)
    print(json.dumps(record, indent=2))
    return 0
