"""Train and score the zoo's small Llama models (target and draft): AdamW with warmup + cosine decay,
fp32 master weights, bf16 autocast on CUDA, one document per row (right-padded, pads ignored)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specbench.zoo.config import LlamaShape, TrainSettings  # noqa: F401 - defined there, light to import

IGNORE_INDEX = -100


def build_llama(shape: LlamaShape, vocab_size: int, max_context: int, eos_token_id: int, pad_token_id: int, seed: int) -> LlamaForCausalLM:
    """A seeded, freshly initialised fp32 Llama with tied input/output embeddings."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=max_context,
        tie_word_embeddings=True,  # halves the embedding bytes the zoo ships
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    return model.float()


def load_lm(directory: Path, device: torch.device):
    """The shipped weights, read back in fp32: every measurement is of what users will load."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    return model.to(device).eval()


def pad_batch(
    documents: Sequence[Sequence[int]], pad_token_id: int, seq_len: int, score_from: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) input ids right-padded to the longest (cut at ``seq_len``) and (B, T) labels: the token
    itself where it is scored, IGNORE_INDEX on pads and before ``score_from[b]``."""
    cut = [list(doc[:seq_len]) for doc in documents]
    width = max(len(doc) for doc in cut)
    ids = torch.full((len(cut), width), pad_token_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(cut), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    for row, doc in enumerate(cut):
        ids[row, : len(doc)] = torch.tensor(doc, dtype=torch.long)
        start = score_from[row] if score_from is not None else 0
        labels[row, start : len(doc)] = ids[row, start : len(doc)]
    return ids, labels


def _next_token_loss(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of predicting ``labels[:, 1:]``, and the (B, T - 1, V) fp32 logits."""
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        # right padding: no scored token attends to a pad under the causal mask, so no mask is needed
        logits = model(input_ids=ids).logits[:, :-1].float()  # (B, T - 1, V)
    targets = labels[:, 1:]  # (B, T - 1)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX), logits


def _cosine_schedule(settings: TrainSettings):
    def factor(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine

    return factor


def train_causal_lm(
    model: LlamaForCausalLM,
    documents: Sequence[Sequence[int]],
    settings: TrainSettings,
    *,
    seed: int,
    device: torch.device | str,
    desc: str = "train",
    progress: bool = True,
) -> list[float]:
    """Train ``model`` in place on ``device``; returns every step's loss. Documents are drawn without
    replacement within an epoch, in an order fixed by ``seed``."""
    device = torch.device(device)
    model.to(device).float().train()
    pad_token_id = model.config.pad_token_id
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms: decaying them only hurts
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _cosine_schedule(settings))
    generator = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(documents), generator=generator), 0
    losses: list[torch.Tensor] = []
    bar = tqdm(range(settings.steps), desc=desc, disable=not progress)
    for step in bar:
        if cursor + settings.batch_size > len(order):  # a new epoch
            order, cursor = torch.randperm(len(documents), generator=generator), 0
        batch = [documents[i] for i in order[cursor : cursor + settings.batch_size].tolist()]
        cursor += settings.batch_size
        ids, labels = pad_batch(batch, pad_token_id, settings.seq_len)
        loss, _ = _next_token_loss(model, ids.to(device), labels.to(device), autocast=device.type == "cuda")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
        if step % 50 == 0 or step == settings.steps - 1:  # reading the loss syncs the device: not every step
            bar.set_postfix(loss=f"{losses[-1].item():.3f}")
    model.eval()
    return torch.stack(losses).cpu().tolist() if losses else []


@torch.no_grad()
def evaluate_lm(
    model: LlamaForCausalLM,
    documents: Sequence[Sequence[int]],
    *,
    seq_len: int,
    batch_size: int = 64,
    score_from: Sequence[int] | None = None,
) -> dict[str, float]:
    """Token-weighted next-token loss and top-1 accuracy on ``documents`` (tokens at positions >=
    ``score_from[b]`` only, when given), in the model's own dtype and device, without autocast."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for start in range(0, len(documents), batch_size):
        chunk = documents[start : start + batch_size]
        from_ = None if score_from is None else score_from[start : start + batch_size]
        ids, labels = pad_batch(chunk, model.config.pad_token_id, seq_len, from_)
        ids, labels = ids.to(device), labels.to(device)
        loss, logits = _next_token_loss(model, ids, labels, autocast=False)
        targets = labels[:, 1:]  # (B, T - 1)
        scored = targets != IGNORE_INDEX  # (B, T - 1)
        n = int(scored.sum())
        total_loss += float(loss) * n
        correct += int((logits.argmax(dim=-1) == targets)[scored].sum())
        count += n
    model.train(was_training)
    if not count:
        raise ValueError("no scored tokens: every document is empty or starts scoring past its end")
    return {"loss": total_loss / count, "top1_accuracy": correct / count, "num_tokens": count}
