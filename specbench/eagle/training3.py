"""EAGLE-3 draft-head training over a reduced draft vocabulary, with training-time test (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

import torch
from torch import nn

from specbench.eagle.eagle3 import Eagle3Config, Eagle3Head
from specbench.eagle.training import (
    EagleTrainSettings, UnrolledAttention, freeze, mean_or_zero, mlp_block, soft_cross_entropy, step0_inputs,
    step_inputs, train_loop, unroll_columns,
)
from specbench.eagle.training_data import FeatureSet, TrainBatch
from specbench.engine.static_ops import rms_norm


def token_counts(data: FeatureSet, vocab_size: int) -> torch.Tensor:
    """(V,) how often each target id is a trained next token: the continuation tokens after each last prompt token."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, start in zip(data.token_ids, data.starts):
        counts += torch.bincount(ids[start + 1:], minlength=vocab_size)
    return counts


def select_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``draft_vocab_size`` most frequent target ids (ties: the lower id), ascending as upstream orders them:
    ``d2t`` (Vd,) int64 with target id = draft id + d2t[draft id], and ``t2d`` (V,) bool marking those ids."""
    vocab = counts.numel()
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be between 1 and the target's vocab_size {vocab}")
    ranking = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))
    chosen = torch.tensor(sorted(ranking[:draft_vocab_size]), dtype=torch.long)  # (Vd,) ascending target ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(draft_vocab_size), t2d


def vocab_coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of the counted next tokens inside the draft vocabulary: the most a draft can ever match."""
    return float(counts[t2d].sum()) / max(1, int(counts.sum()))


def new_eagle3_head(config: Eagle3Config, d2t: torch.Tensor, t2d: torch.Tensor, *, target_lm_head: torch.Tensor,
                    target_norm: torch.Tensor, seed: int) -> Eagle3Head:
    """A seeded fresh head whose lm_head starts as the target's rows of the draft ids (V, H) -> (Vd, H) and whose
    final norm starts as the target's: before any step it scores as the target would score its input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config)
    with torch.no_grad():
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        head.lm_head.weight.copy_(target_lm_head[head.draft_to_target()])  # (Vd, H)
        head.norm.weight.copy_(target_norm)
    return head


def eagle3_step(head: Eagle3Head, attention: UnrolledAttention, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """One unroll step of the midlayer: embeddings and hidden (fc's output, or the parent's output) (B, W', H) at
    step 0, (B, A, H) after it -> (B, A, H) outputs of the drafted columns."""
    layer = head.midlayer
    normed_hidden = rms_norm(hidden, layer.hidden_norm.weight, layer.hidden_norm.eps)  # (B, W', H)
    x = torch.cat([rms_norm(embeds, layer.input_layernorm.weight, layer.input_layernorm.eps), normed_hidden],
                  dim=-1)  # embedding first
    attended = attention(x)  # (B, A, H)
    residual = normed_hidden if layer.norm_before_residual else hidden  # as Eagle3DecoderLayer.forward
    return mlp_block(layer, residual[:, residual.shape[1] - attended.shape[1]:] + attended)


def draft_logits(head: Eagle3Head, out: torch.Tensor) -> torch.Tensor:
    """(M, Vd) fp32 of pre-norm outputs (M, H): the final norm, then the head's own lm_head."""
    return head.lm_head(rms_norm(out, head.norm.weight, head.norm.eps)).float()


def eagle3_loss(head: Eagle3Head, embedding: nn.Module, target_lm_head: nn.Module, batch: TrainBatch,
                settings: EagleTrainSettings, generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """EAGLE-3's unrolled loss; per step: the loss and the top-1 agreement with the target's token over every
    trained position (a target token outside the draft vocabulary counts as a miss, as it does when drafting)."""
    if batch.aux is None:
        raise ValueError("EAGLE-3 training needs the target's aux-layer features: collect them with aux_layers")
    draft_ids = head.draft_to_target()  # (Vd,)
    embeds, aux = step0_inputs(batch, embedding, batch.aux, settings, generator)  # (B, W', H), (B, W', 3H)
    hidden = head.fc(aux)  # (B, W', H) fused aux features of every draft column
    attention = UnrolledAttention(head.midlayer.self_attn, head.inv_freq, batch)
    total, stats, keep, out = hidden.new_zeros(()), {"loss": [], "top1": []}, unroll_columns(batch, settings, generator), None
    for step in range(settings.unroll):
        with torch.no_grad():
            step_embeds, goal, trained = step_inputs(batch, embedding, step, keep)  # at position i + 1 + step
            want_logits = target_lm_head(goal[trained]).float()  # (M, V) the target's logits there
            want_token = want_logits.argmax(-1)  # (M,)
            in_vocab = head.t2d[want_token]  # (M,)
        if step:  # depth j reads token i + 1 + j and its parent's pre-norm output
            if step == 1 and keep is not None:
                attention.narrow(keep)
                out = out[:, keep]
            embeds, hidden = step_embeds, out
        out = eagle3_step(head, attention, embeds, hidden)  # (B, A, H)
        logits = draft_logits(head, out[trained])  # (M, Vd)
        loss = mean_or_zero(soft_cross_entropy(logits[in_vocab], want_logits[in_vocab][:, draft_ids]))
        total = total + settings.unroll_decay ** step * loss
        stats["loss"].append(loss.item())
        stats["top1"].append(mean_or_zero((draft_ids[logits.argmax(-1)] == want_token).float()).item())
    return total, stats


def train_eagle3_head(head: Eagle3Head, data: FeatureSet, embedding: nn.Module, target_lm_head: nn.Module,
                      settings: EagleTrainSettings, *, device="cpu", progress: bool = True) -> list[dict]:
    """Train a fresh EAGLE-3 head in place on ``data`` (aux and final features); the target's modules stay frozen."""
    freeze(embedding, target_lm_head)
    return train_loop(head, lambda batch, gen: eagle3_loss(head, embedding, target_lm_head, batch, settings, gen), data,
                      settings, device=device, desc="eagle3 head", progress=progress)
