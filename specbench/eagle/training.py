"""EAGLE-1/2 draft-head training by self-distillation on a frozen target's own greedy outputs (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from specbench.eagle.draft_head import EagleHead
from specbench.eagle.training_data import FeatureSet, TrainBatch, make_batch
from specbench.engine.static_llama import FusedLinear
from specbench.engine.static_ops import rms_norm, rotary_tables


@dataclass(frozen=True)
class EagleTrainSettings:
    steps: int
    batch_size: int  # sequences per step
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    reg_weight: float = 1.0  # EAGLE-1: smooth L1 between predicted and target feature
    cls_weight: float = 0.1  # EAGLE-1: cross-entropy of the target lm_head's distributions
    noise: float = 0.2  # EAGLE-1: width of the uniform noise added to the step-0 input features
    unroll: int = 1  # training-time test steps (1: teacher-forced features only, EAGLE-1's recipe)
    unroll_decay: float = 0.8  # step j's loss weight is unroll_decay ** j (EAGLE-3's 0.8)
    # share of the drafted positions unrolled beyond step 0, a random subset per batch (1: all, as upstream): the
    # chains are independent of each other, so a subset estimates the same loss at a fraction of the cost
    unroll_fraction: float = 1.0
    seed: int = 0


def shifted(x: torch.Tensor, k: int, width: int) -> torch.Tensor:
    """``x[:, k : k + width]`` (B, width, ...), zero-padded where it runs past x's end."""
    part = x[:, k: k + width]
    if part.shape[1] == width:
        return part
    return torch.cat([part, part.new_zeros(part.shape[0], width - part.shape[1], *part.shape[2:])], dim=1)


def position_mask(batch: TrainBatch, step: int) -> torch.Tensor:
    """(B, A) bool over the drafted columns: root position i trains at unroll step j when position i + 1 + j has
    a next token to predict (i + 1 + j <= length - 2); every drafted column has i >= the last prompt token."""
    i = batch.positions[:, batch.active: batch.width]  # (B, A)
    return i + 1 + step <= batch.lengths[:, None] - 2


def unroll_columns(batch: TrainBatch, settings, generator: torch.Generator | None) -> torch.Tensor | None:
    """(A',) the drafted columns unrolled beyond step 0: a random ``unroll_fraction`` of them (None: all, and
    always all when measuring, without a generator)."""
    if settings.unroll < 2 or settings.unroll_fraction >= 1 or generator is None:
        return None
    count = max(1, math.ceil(settings.unroll_fraction * batch.num_active))
    return torch.randperm(batch.num_active, generator=generator)[:count].sort().values.to(batch.ids.device)


def step_inputs(batch: TrainBatch, embedding: nn.Module, step: int, keep: torch.Tensor | None = None):
    """Unroll step j of the drafted columns (``keep`` of them from step 1 on): (B, A, H) embeddings of token
    i + 1 + j, the target's final features at i + 1 + j (step j's regression goal and distribution) and (B, A)
    the position mask."""
    begin = batch.active + 1 + step
    embeds = embedding(shifted(batch.ids, begin, batch.num_active))
    goal, mask = shifted(batch.final, begin, batch.num_active), position_mask(batch, step)
    if keep is not None and step:
        embeds, goal, mask = embeds[:, keep], goal[:, keep], mask[:, keep]
    return embeds, goal, mask


# ---------------------------------------------------------------- the draft layer, batched and differentiable


def _rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x (B, N, T, D) rotated to positions (B, T), rotate-half with static_ops' fp32 tables."""
    cos, sin = rotary_tables(inv_freq.to(x.device), positions.flatten(), x.dtype)  # (B*T, D) each
    cos, sin = cos.view(x.shape[0], 1, x.shape[2], -1), sin.view(x.shape[0], 1, x.shape[2], -1)  # (B, 1, T, D)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _heads(proj: nn.Linear, x: torch.Tensor, num: int, head_dim: int) -> torch.Tensor:
    batch, length = x.shape[:2]
    return proj(x).view(batch, length, num, head_dim).transpose(1, 2)  # (B, num, T, D)


class UnrolledAttention:
    """One draft layer's attention over the unroll steps, as the draft cache holds it while drafting: the first
    call (step 0) takes every draft column and writes the context keys; a drafted column's query at step j sees
    step 0's keys at its position and before, and its own column's keys of steps 1..j (its chain)."""

    def __init__(self, attn: nn.Module, inv_freq: torch.Tensor, batch: TrainBatch):
        self.attn, self.inv_freq, self.active = attn, inv_freq, batch.active
        self.positions = batch.positions[:, : batch.width]  # (B, W')
        keys = self.positions[:, None, :] >= 0  # (B, 1, W') not a left pad
        causal = torch.ones(batch.num_active, batch.width, dtype=torch.bool, device=keys.device).tril_(batch.active)
        allowed = keys[:, :, None, :] & causal  # (B, 1, A, W')
        self.bias0 = torch.zeros(allowed.shape, device=keys.device).masked_fill_(~allowed, float("-inf"))
        self.drafted = self.positions[:, self.active:]  # (B, A) the drafted columns' positions
        self.keys: list[torch.Tensor] = []  # step 0: (B, NH, W', D); step j: (B, NH, A, D); kv heads repeated
        self.values: list[torch.Tensor] = []

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> None:
        attn = self.attn
        repeat = attn.num_heads // attn.num_kv_heads
        k = _rope(_heads(attn.k_proj, x, attn.num_kv_heads, attn.head_dim), positions, self.inv_freq)
        self.keys.append(k.repeat_interleave(repeat, dim=1))
        self.values.append(_heads(attn.v_proj, x, attn.num_kv_heads, attn.head_dim).repeat_interleave(repeat, dim=1))

    def narrow(self, keep: torch.Tensor) -> None:
        """Unroll only the drafted columns ``keep`` (A',) from step 1 on; called between step 0 and step 1."""
        self.drafted, self.bias0 = self.drafted[:, keep], self.bias0[:, :, keep]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: step 0 (B, W', Hin) every draft column; step j (B, A, Hin) the drafted ones -> (B, A, H)."""
        attn, step = self.attn, len(self.keys)
        nh, d = attn.num_heads, attn.head_dim
        drafted = self.drafted + step  # (B, A) rotary positions i + j
        if step == 0:
            self._kv(x, self.positions)
            x = x[:, self.active:]  # (B, A, Hin)
        else:
            self._kv(x, drafted)
        q = _rope(_heads(attn.q_proj, x, nh, d), drafted, self.inv_freq)  # (B, NH, A, D)
        scale = 1.0 / math.sqrt(d)
        scores = q @ self.keys[0].transpose(-1, -2) * scale + self.bias0  # (B, NH, A, W')
        own = [(q * ks).sum(-1, keepdim=True) * scale for ks in self.keys[1:]]  # (B, NH, A, 1) each
        probs = torch.softmax(torch.cat([scores, *own], dim=-1).float(), dim=-1).to(x.dtype)  # (B, NH, A, W' + j)
        width = self.keys[0].shape[2]
        out = probs[..., :width] @ self.values[0]  # (B, NH, A, D)
        for s, vs in enumerate(self.values[1:]):
            out = out + probs[..., width + s: width + s + 1] * vs
        return attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], nh * d))  # (B, A, H)


def mlp_block(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """h + mlp(post_attention_layernorm(h)) (B, T, H): the layer's second half, as at inference."""
    post, mlp = layer.post_attention_layernorm, layer.mlp
    normed = rms_norm(h, post.weight, post.eps)
    return h + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))


def eagle_step(head: EagleHead, attention: UnrolledAttention, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """One unroll step of an EAGLE-1/2 head: embeddings and features (B, W', H) at step 0, (B, A, H) after it ->
    (B, A, H) outputs of the drafted columns."""
    x = head.fc(torch.cat([embeds, features], dim=-1))  # embedding first, as cnets1
    attended = attention(x)  # (B, A, H): no input norm, attention reads x as it is
    return mlp_block(head.layers[0], x[:, x.shape[1] - attended.shape[1]:] + attended)


# ---------------------------------------------------------------- losses


def mean_or_zero(values: torch.Tensor) -> torch.Tensor:
    """The mean, or 0 (with the graph kept) when there is nothing to average."""
    return values.mean() if values.numel() else values.sum()


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """(M,) cross-entropy of logits (M, V) against the distribution softmax(target_logits) (M, V)."""
    target = torch.softmax(target_logits.float(), dim=-1)
    return -(target * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def step0_inputs(batch: TrainBatch, embedding: nn.Module, feature: torch.Tensor, settings: EagleTrainSettings,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, W', H) embeddings of token c + 1 and (B, W', F) features of every draft column, with settings.noise
    uniform noise on the features when a generator is given (training, not evaluation)."""
    with torch.no_grad():
        embeds = embedding(batch.ids[:, 1:])
    features = feature[:, : batch.width]
    if settings.noise and generator is not None:
        noise = torch.rand(features.shape, generator=generator).to(features.device) - 0.5
        features = features + settings.noise * noise
    return embeds, features


def eagle_loss(head: EagleHead, embedding: nn.Module, lm_head: nn.Module, batch: TrainBatch, settings: EagleTrainSettings,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """EAGLE-1's loss summed over the unroll steps: w_reg * smooth L1 to the next feature + w_cls * cross-entropy
    of lm_head(predicted) against lm_head(next feature). Returns the loss and per-step loss and top-1 agreement."""
    embeds, features = step0_inputs(batch, embedding, batch.final, settings, generator)
    attention = UnrolledAttention(head.layers[0].self_attn, head.inv_freq, batch)
    total, stats, keep, out = features.new_zeros(()), {"loss": [], "top1": []}, unroll_columns(batch, settings, generator), None
    for step in range(settings.unroll):
        with torch.no_grad():
            step_embeds, goal, mask = step_inputs(batch, embedding, step, keep)  # at position i + 1 + step
            want = goal[mask]  # (M, H)
            want_logits = lm_head(want)  # (M, V)
        if step:  # depth j reads token i + 1 + j and its parent's output, as drafting does
            if step == 1 and keep is not None:
                attention.narrow(keep)
                out = out[:, keep]
            embeds, features = step_embeds, out
        out = eagle_step(head, attention, embeds, features)  # (B, A, H)
        pred = out[mask]  # (M, H)
        logits = lm_head(pred)  # (M, V)
        reg = mean_or_zero(F.smooth_l1_loss(pred, want, reduction="none"))
        cls = mean_or_zero(soft_cross_entropy(logits, want_logits))
        loss = settings.reg_weight * reg + settings.cls_weight * cls
        total = total + settings.unroll_decay ** step * loss
        stats["loss"].append(loss.item())
        stats["top1"].append(mean_or_zero((logits.argmax(-1) == want_logits.argmax(-1)).float()).item())
    return total, stats


# ---------------------------------------------------------------- the loop


def cosine_factor(settings: EagleTrainSettings, step: int) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def trainable(head: nn.Module) -> list[nn.Parameter]:
    """A fresh head's parameters, ready for gradients (a prepared head's q/k/v and gate/up are fused views: refused)."""
    if any(m.weight is not None for m in head.modules() if isinstance(m, FusedLinear)):
        raise ValueError(f"this {type(head).__name__} was prepared for drafting (fused weights); train a freshly "
                         "constructed head, then save it")
    params = list(head.parameters())
    for p in params:
        p.requires_grad_(True)
    return params


def train_loop(head: nn.Module, loss_fn, data: FeatureSet, settings: EagleTrainSettings, *, device, desc: str,
               progress: bool) -> list[dict]:
    """AdamW over ``head`` with warmup + cosine; sequences drawn without replacement within an epoch in an order
    fixed by ``settings.seed``. ``loss_fn(batch, generator)`` -> (loss, stats); returns every step's stats."""
    if len(data) < settings.batch_size:
        raise ValueError(f"{len(data)} training sequences for a batch of {settings.batch_size}; collect more sequences")
    head.to(device).train()
    params = trainable(head)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_factor(settings, step))
    generator = torch.Generator().manual_seed(settings.seed)
    order, cursor, history = torch.randperm(len(data), generator=generator), 0, []
    bar = tqdm(range(settings.steps), desc=desc, disable=not progress)
    for _ in bar:
        if cursor + settings.batch_size > len(order):  # a new epoch
            order, cursor = torch.randperm(len(data), generator=generator), 0
        batch = make_batch(data, order[cursor: cursor + settings.batch_size].tolist(), device)
        cursor += settings.batch_size
        loss, stats = loss_fn(batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        scheduler.step()
        history.append({"total": loss.item(), **stats})
        bar.set_postfix(loss=f"{history[-1]['total']:.3f}", top1=f"{stats['top1'][0]:.2f}")
    head.eval()
    return history


def freeze(*modules: nn.Module) -> None:
    """The target's borrowed modules (embedding, lm_head) take no gradient."""
    for module in modules:
        module.requires_grad_(False)


def train_eagle_head(head: EagleHead, data: FeatureSet, embedding: nn.Module, lm_head: nn.Module,
                     settings: EagleTrainSettings, *, device="cpu", progress: bool = True) -> list[dict]:
    """Train a fresh EAGLE-1/2 head in place on ``data`` (final features); the target's ``embedding`` and
    ``lm_head`` stay frozen. Returns every step's {"total", "loss": [per unroll step], "top1": [...]}."""
    freeze(embedding, lm_head)
    return train_loop(head, lambda batch, gen: eagle_loss(head, embedding, lm_head, batch, settings, gen), data, settings,
                      device=device, desc="eagle head", progress=progress)


@torch.no_grad()
def evaluate(loss_fn, data: FeatureSet, *, batch_size: int, device) -> dict:
    """Loss and top-1 agreement with the target per unroll step on ``data`` (teacher-forced tokens, every position
    unrolled, no noise; the mean over batches)."""
    sums, batches = None, 0
    for begin in range(0, len(data), batch_size):
        _, stats = loss_fn(make_batch(data, list(range(begin, min(begin + batch_size, len(data)))), device), None)
        sums = stats if sums is None else {k: [a + b for a, b in zip(sums[k], v)] for k, v in stats.items()}
        batches += 1
    return {k: [x / batches for x in v] for k, v in sums.items()}
