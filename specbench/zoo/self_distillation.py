"""Self-distillation data for the zoo's Medusa heads and draft: the frozen target's own greedy
continuations of GSM8K prompts, with the final hidden states the heads read."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from specbench.medusa.training import IGNORE_INDEX, collect_self_distillation
from specbench.zoo.corpus import document_text, prompt_ids
from specbench.zoo.tokenizer import encode_documents


def collect_continuations(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, batch_size: int, progress: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, tokens)`` as collect_self_distillation returns them — ``(B, G + 1, H)`` post-norm
    hidden states from the last prompt position on, ``(B, G + 1)`` tokens, every token after the
    first generated EOS set to IGNORE_INDEX."""
    return collect_self_distillation(
        model, prompts, max_new_tokens, batch_size=batch_size, pad_token_id=model.config.pad_token_id, progress=progress
    )


def answer_prefix_prompts(
    documents: Sequence[Sequence[int]], prompt_lengths: Sequence[int], count: int, seed: int, max_length: int
) -> list[list[int]]:
    """``count`` prompts cut from training documents: the question and a random leading part of
    its reference answer (at least one answer token, never the final EOS), at most ``max_length``
    tokens unless the question alone is longer (so prompt + continuation stays within the
    positions the target was trained on)."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(documents), (count,), generator=generator).tolist()
    prompts = []
    for index in picks:
        doc, start = documents[index], prompt_lengths[index]
        answer_tokens = len(doc) - 1 - start  # without the EOS
        cut = start + 1 + int(torch.randint(0, max(1, answer_tokens), (1,), generator=generator))
        prompts.append(list(doc[: min(cut, len(doc) - 1, max(start + 1, max_length))]))
    return prompts


def distillation_prompts(tokenizer, distill_records: list[dict], num_answer_prefix_prompts: int, seed: int,
                         max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """The self-distillation prompts: one zero-shot prompt per distillation question, then the question + a
    seeded cut of its reference answer (``seed``: the build's prefix_cuts stream). The EAGLE stage regenerates
    exactly these from a build's record."""
    questions = prompt_ids(tokenizer, [r["question"] for r in distill_records])
    documents = encode_documents(tokenizer, [document_text(r) for r in distill_records])
    prefixes = answer_prefix_prompts(documents, [len(p) for p in questions], num_answer_prefix_prompts, seed,
                                     max_length=max_length)
    return questions, prefixes


def continuation_documents(prompts: Sequence[Sequence[int]], tokens: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """Each prompt followed by the target's continuation (up to and including its EOS), and the
    index where the continuation starts: training data for a draft that imitates the target."""
    documents, starts = [], []
    for prompt, row in zip(prompts, tokens[:, 1:].tolist()):  # column 0 is the prompt's last token
        generated = [t for t in row if t != IGNORE_INDEX]  # IGNORE_INDEX only ever fills the tail
        documents.append(list(prompt) + generated)
        starts.append(len(prompt))
    return documents, starts
