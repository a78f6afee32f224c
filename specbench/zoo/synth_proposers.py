"""The synthetic EAGLE-2 head, EAGLE-3 head and draft model of `specbench zoo synth`: real shapes and layouts whose
agreement with the decisive target is decided by construction, a profile's misses laid along the target's successor
cycle (docs/zoo.md#proposer-profiles)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from specbench.eagle.checkpoint import save_eagle_head
from specbench.eagle.checkpoint3 import save_eagle3_head
from specbench.eagle.draft_head import EagleConfig, EagleHead
from specbench.eagle.eagle3 import Eagle3Config, Eagle3Head, eagle3_aux_layers
from specbench.zoo.acceptance_profiles import miss_positions, plan_segments

# how far below every other logit a missed token's right answer is pushed (in units of the top logit, ~sqrt(H)):
# it never enters a dynamic tree's top-k, so a tree gains nothing over the head's top-1 path
EXCLUDED_ANSWER_WEIGHT = 1.0
# q = k = QK_SCALE * input_layernorm(embed) per head: a node's score against itself is QK_SCALE^2 * sqrt(head_dim),
# against an unrelated token QK_SCALE^2 * N(0, 1), so EAGLE-3's attention reads the node's own token
QK_SCALE = 2.0
WEIGHT_STD = 0.02  # matrices that still run (and cost) but whose output a zero matrix drops: Llama's initializer range


class ProfileMisses:
    """Which ordinary tokens a profile proposer gets wrong, and what it proposes instead.

    ``order`` (N,) is the target's successor cycle; the misses are the cycle positions plan_segments gives. Each
    token's *answer* is what the proposer's top-1 continues it with: its successor, or for the j-th miss the successor
    of the (j + 1)-th (a derangement of the misses: always wrong, every answer row used once)."""

    def __init__(self, order: torch.Tensor, per_position: tuple[float, ...], vocab_size: int):
        self.order = order  # (N,)
        positions = torch.tensor(miss_positions(plan_segments(order.numel(), per_position)), device=order.device)
        if positions.numel() < 2:  # one miss cannot be sent to another miss's answer
            raise ValueError(f"a cycle of {order.numel()} tokens holds {positions.numel()} segment of a depth-"
                             f"{len(per_position)} profile; it needs two: use a larger vocabulary")
        self.missed = order[positions]  # (M,)
        self.instead = self.missed.roll(-1)  # (M,) the miss whose answer each miss proposes
        successor = torch.zeros(vocab_size, dtype=torch.long, device=order.device)  # special tokens: 0, never used
        successor[order] = order.roll(-1)
        self.successor = successor  # (V,) successor[t] for ordinary t
        answers = successor.clone()
        answers[self.missed] = successor[self.instead]
        self.answer = answers  # (V,) answer[t] for ordinary t

    def projection(self, keys: torch.Tensor, rows: int) -> torch.Tensor:
        """(rows, H) vocab projection whose top-1 for ``keys[t]`` (unit rms, (V, H)) is ``answer[t]``, with a logit of
        ~sqrt(H) against ~N(0, 1) for unrelated rows; a miss's right answer scores ~-sqrt(H)."""
        hidden = keys.shape[1]
        projection = torch.zeros(rows, hidden, dtype=keys.dtype, device=keys.device)  # unused rows: logit 0
        projection[self.answer[self.order]] = keys[self.order] / math.sqrt(hidden)
        projection[self.successor[self.missed]] -= EXCLUDED_ANSWER_WEIGHT * keys[self.missed] / math.sqrt(hidden)
        return projection


def _random(shape, dtype, generator: torch.Generator) -> torch.Tensor:
    drawn = torch.empty(shape, dtype=torch.float32, device=generator.device)
    return drawn.normal_(0.0, WEIGHT_STD, generator=generator).to(dtype)


def publish_directory(staging: Path, out_dir: Path, name: str) -> Path:
    """Move a finished staging directory to ``out_dir/name``, replacing what was there."""
    final = out_dir / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def _publish_head(out_dir: Path, name: str, save) -> Path:
    """``save(path)`` writes a head directory into a staging directory inside ``out_dir``; it then replaces
    ``out_dir/name`` in one rename (an earlier one is removed first)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out_dir))
    try:
        return publish_directory(save(staging / name), out_dir, name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _head_config(shape: dict) -> dict:
    """One target layer's shape, as a published EAGLE head's config.json gives it."""
    return dict(hidden_size=shape["hidden_size"], intermediate_size=shape["intermediate_size"],
                num_attention_heads=shape["num_attention_heads"],
                num_key_value_heads=shape.get("num_key_value_heads", shape["num_attention_heads"]),
                vocab_size=shape["vocab_size"], rms_norm_eps=shape.get("rms_norm_eps", 1e-6),
                max_position_embeddings=shape.get("max_position_embeddings", 2048))


def eagle_profile_head(embed: torch.Tensor, embed_std: float, shape: dict, misses: ProfileMisses, *,
                       dtype: torch.dtype, seed: int) -> EagleHead:
    """An EAGLE-1/2 head whose output for token t is the target's final hidden state of t's answer.

    ``embed_tokens`` ships (as the published Vicuna heads do): the target's rows, except a miss t's row, which is
    ``embed[instead] - embed[t]``; ``fc = [I / embed_std, 0]`` turns it into a unit-rms output and ignores the
    feature; ``o_proj`` and ``down_proj`` are zero, so the layer adds nothing. The target's lm_head (row succ(u) =
    embed[u] / (std sqrt(H))) then ranks answer[t] first at ~sqrt(H) and a miss's successor last at ~-sqrt(H)."""
    config = EagleConfig(**_head_config(shape), bias=True)
    hidden = config.hidden_size
    generator = torch.Generator(device=embed.device).manual_seed(seed + 3)
    with torch.device(embed.device):
        head = EagleHead(config, with_embed=True).to(dtype)
    with torch.no_grad():
        own = embed.clone()  # (V, H)
        own[misses.missed] = embed[misses.instead] - EXCLUDED_ANSWER_WEIGHT * embed[misses.missed]
        head.embed_tokens.weight.copy_(own)
        fc = torch.zeros(hidden, 2 * hidden, device=embed.device)  # (H, 2H): [embedding | feature]
        fc[:, :hidden] = torch.eye(hidden, device=embed.device) / embed_std
        head.fc.weight.copy_(fc)
        head.fc.bias.zero_()
        layer = head.layers[0]
        for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
                       layer.mlp.up_proj):
            linear.weight.copy_(_random(linear.weight.shape, dtype, generator))
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        layer.post_attention_layernorm.weight.fill_(1.0)
    return head


def eagle3_profile_head(embed: torch.Tensor, embed_std: float, shape: dict, misses: ProfileMisses, *,
                        dtype: torch.dtype, seed: int) -> Eagle3Head:
    """An EAGLE-3 head (SafeAILab layout, draft vocabulary = the target's) whose top-1 for token t is answer[t].

    Codes live on U, the first num_key_value_heads * head_dim dimensions (all of them without GQA): code(t) =
    embed[t] / embed_std on U. ``fc`` reads the earliest aux stream (the residual entering the lowest of
    eagle3_aux_layers, ~embed of the position's token) into code(previous token). The attention reads the node's own
    token (q = k = QK_SCALE x its normed embedding per key/value head) with values code(t) - code(residual), so the
    layer's output, residual + attention, is code(t) at every depth; mlp's down_proj is zero. The head's own lm_head
    is ProfileMisses.projection over normed codes."""
    config = Eagle3Config(**_head_config(shape), draft_vocab_size=shape["vocab_size"])
    hidden, heads, kv_heads, head_dim = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                         config.head_dim)
    group, width = heads // kv_heads, kv_heads * head_dim  # query heads per key/value head; |U|
    device = embed.device
    generator = torch.Generator(device=device).manual_seed(seed + 4)
    with torch.device(device):
        head = Eagle3Head(config, with_vocab_map=False).to(dtype)
    layer, attn = head.midlayer, head.midlayer.self_attn
    on_u = torch.eye(hidden, device=device)[:width]  # (|U|, H): selects U
    with torch.no_grad():
        lowest = min(range(3), key=lambda i: eagle3_aux_layers(shape["num_hidden_layers"])[i])
        fc = torch.zeros(hidden, 3 * hidden, device=device)  # (H, 3H): one aux stream onto U
        fc[:width, lowest * hidden:(lowest + 1) * hidden] = on_u / embed_std
        head.fc.weight.copy_(fc)
        # q/k/v read cat(input_layernorm(embed), hidden_norm(hidden)) (2H); key/value head g owns U's [g D, (g+1) D)
        kv_from_embed = torch.cat([on_u, torch.zeros(width, hidden, device=device)], dim=1)  # (|U|, 2H)
        attn.k_proj.weight.copy_(QK_SCALE * kv_from_embed)
        attn.q_proj.weight.copy_(QK_SCALE * kv_from_embed.view(kv_heads, 1, head_dim, 2 * hidden)
                                 .expand(kv_heads, group, head_dim, 2 * hidden).reshape(heads * head_dim, 2 * hidden))
        # hidden_norm(residual) = code * sqrt(H / |U|): scaled back, the value cancels the residual
        from_hidden = torch.cat([torch.zeros(width, hidden, device=device), on_u], dim=1)  # (|U|, 2H)
        attn.v_proj.weight.copy_(kv_from_embed - math.sqrt(width / hidden) * from_hidden)
        o_proj = torch.zeros(hidden, heads * head_dim, device=device)  # (H, heads D): one query head per group
        for g in range(kv_heads):
            q = g * group
            rows, columns = slice(g * head_dim, (g + 1) * head_dim), slice(q * head_dim, (q + 1) * head_dim)
            o_proj[rows, columns] = torch.eye(head_dim, device=device)
        attn.o_proj.weight.copy_(o_proj)
        for linear in (layer.mlp.gate_proj, layer.mlp.up_proj):
            linear.weight.copy_(_random(linear.weight.shape, dtype, generator))
        layer.mlp.down_proj.weight.zero_()
        for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm, head.norm):
            norm.weight.fill_(1.0)
        # (V, H) what the head's final norm leaves of code(t): unit rms over H, all of it on U
        codes = torch.zeros_like(embed, dtype=torch.float32)
        on = embed[:, :width].float()  # (V, |U|)
        codes[:, :width] = on / on.pow(2).mean(-1, keepdim=True).sqrt() * math.sqrt(hidden / width)
        head.lm_head.weight.copy_(misses.projection(codes, config.vocab_size))
    return head


def draft_profile_model(draft, embed_std: float, misses: ProfileMisses):
    """A decisive draft Llama (``draft``, made as the target is, with its own embeddings) whose lm_head is
    re-aimed at the target's cycle: its greedy continuation of t is answer[t]."""
    embed = draft.get_input_embeddings().weight  # (V, Hd)
    head = draft.get_output_embeddings().weight  # (V, Hd)
    with torch.no_grad():
        keys = (embed.float() / embed_std)  # (V, Hd) ~unit rms: what the final norm leaves of the embedding
        rows = misses.projection(keys, head.shape[0])
        ordinary = misses.order
        head[ordinary] = rows[ordinary].to(head.dtype)  # every ordinary row: the special tokens' stay as drawn
    return draft


def save_eagle_profile(out_dir: Path, head: EagleHead, name: str = "eagle-profile") -> Path:
    """The head as ``out_dir/name``: pytorch_model.bin and config.json, the published EAGLE-1 layout (embed_tokens in)."""
    return _publish_head(out_dir, name, lambda path: save_eagle_head(path, head, format="bin", with_embed=True))


def save_eagle3_profile(out_dir: Path, head: Eagle3Head, name: str = "eagle3-profile") -> Path:
    """The head as ``out_dir/name`` in SafeAILab's EAGLE-3 layout (no d2t/t2d: the draft vocabulary is the target's)."""
    return _publish_head(out_dir, name, lambda path: save_eagle3_head(path, head, with_vocab_map=False))
