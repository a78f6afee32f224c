"""EAGLE training data: the target's greedy continuations with its features, and batches aligned at the last prompt token (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


@dataclass
class FeatureSet:
    """Sequences with the target's features at every position; draft positions ``starts[n]`` on are trained."""

    token_ids: list[torch.Tensor]  # (T_n,) int64 each
    final: list[torch.Tensor]  # (T_n, H) post-norm last hidden states: EAGLE-1/2's feature and the target's logits
    aux: list[torch.Tensor] | None  # (T_n, A * H) streams entering the aux layers: EAGLE-3's feature
    starts: list[int]  # index of each sequence's last prompt token

    def __len__(self) -> int:
        return len(self.token_ids)


def through_eos(tokens: list[int], eos) -> list[int]:
    """``tokens`` up to and including the first EOS (``eos``: an id, a list of ids or None)."""
    stops = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    for n, token in enumerate(tokens):
        if token in stops:
            return tokens[: n + 1]
    return tokens


def _left_padded(prompts: list[list[int]], rows: list[int], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, P) ids and attention mask of ``prompts[rows]``, left-padded so every last prompt token is column P - 1."""
    width = max(len(prompts[n]) for n in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (b, P)
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # (b, P)
    for r, n in enumerate(rows):
        ids[r, width - len(prompts[n]):], mask[r, width - len(prompts[n]):] = torch.tensor(prompts[n]), 1
    return ids, mask


def _row_features(steps: tuple, row: int, prompt_length: int, length: int, layers: tuple[int, ...]) -> torch.Tensor:
    """(length, F) one row's stream(s) ``layers`` from generate's per-step hidden states: step 0 (b, P, H) holds
    the prompt, step t (b, 1, H) position P - 1 + t; the last token's (never computed) stays zero."""
    prompt = torch.cat([steps[0][k][row, -prompt_length:] for k in layers], dim=-1)  # (P, F)
    rest = [torch.cat([step[k][row, 0] for k in layers], dim=-1) for step in steps[1: length - prompt_length]]
    out = torch.cat([prompt, *(r[None] for r in rest)])  # (length - 1, F)
    return torch.cat([out.float().cpu(), out.new_zeros(1, out.shape[1]).float().cpu()])  # (length, F)


@torch.no_grad()
def generate_features(model, prompts: list[list[int]], max_new_tokens: int, *, aux_layers: tuple[int, ...] = (),
                      batch_size: int = 64, progress: bool = False) -> FeatureSet:
    """The target's greedy continuation of each prompt (through its first EOS) with the features it computed on
    the way, as the decoding engine sees them: the final hidden states and the streams entering ``aux_layers``.
    Batches of similar prompt length, left-padded, on a static cache (several times faster than a dynamic one on
    a CPU)."""
    eos, pad = model.generation_config.eos_token_id, model.config.pad_token_id
    pad, final_layer, device = 0 if pad is None else pad, model.config.num_hidden_layers, next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda n: len(prompts[n]))
    tokens, final, aux = [None] * len(prompts), [None] * len(prompts), [None] * len(prompts)
    for begin in tqdm(range(0, len(order), batch_size), desc="eagle self-distillation", disable=not progress):
        rows = order[begin: begin + batch_size]
        ids, mask = _left_padded(prompts, rows, pad)
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, cache_implementation="static", output_hidden_states=True,
                             return_dict_in_generate=True)  # hidden_states[t][k]: k = 0..L, L the normed output
        for r, n in enumerate(rows):
            sequence = list(prompts[n]) + through_eos(out.sequences[r, ids.shape[1]:].tolist(), eos)
            tokens[n] = torch.tensor(sequence, dtype=torch.long)
            final[n] = _row_features(out.hidden_states, r, len(prompts[n]), len(sequence), (final_layer,))
            aux[n] = _row_features(out.hidden_states, r, len(prompts[n]), len(sequence), aux_layers) if aux_layers else None
    return FeatureSet(tokens, final, aux if aux_layers else None, [len(p) - 1 for p in prompts])


@dataclass
class TrainBatch:
    """Rows aligned at their last prompt token: row b is left-padded by ``S - starts[b]``, so draft columns
    ``[S, W - 1)`` are the drafted (trained) positions of every row and the columns before them their context."""

    ids: torch.Tensor  # (B, W) int64, 0 in the pads
    final: torch.Tensor  # (B, W, H)
    aux: torch.Tensor | None  # (B, W, A*H)
    positions: torch.Tensor  # (B, W) int64: the position each column holds (negative in the left pad)
    lengths: torch.Tensor  # (B,)
    active: int  # S: the first drafted column

    @property
    def width(self) -> int:
        """W - 1 draft columns: column c reads feature c and token c + 1."""
        return self.ids.shape[1] - 1

    @property
    def num_active(self) -> int:
        return self.width - self.active


def _aligned(rows: list[torch.Tensor], offsets: list[int], width: int) -> torch.Tensor:
    """(B, width, ...) with row b's (T_b, ...) values starting at column offsets[b], zeros elsewhere."""
    out = rows[0].new_zeros(len(rows), width, *rows[0].shape[1:])
    for r, (row, offset) in enumerate(zip(rows, offsets)):
        out[r, offset: offset + row.shape[0]] = row
    return out


def make_batch(data: FeatureSet, index: list[int], device) -> TrainBatch:
    """The sequences ``index`` as one batch on ``device``, aligned at their last prompt tokens."""
    starts = [data.starts[i] for i in index]
    active = max(starts)
    offsets = [active - s for s in starts]
    lengths = [data.token_ids[i].numel() for i in index]
    width = max(o + n for o, n in zip(offsets, lengths))
    aux = None if data.aux is None else _aligned([data.aux[i] for i in index], offsets, width).to(device)
    positions = torch.arange(width)[None] - torch.tensor(offsets)[:, None]  # (B, W)
    return TrainBatch(
        ids=_aligned([data.token_ids[i] for i in index], offsets, width).to(device),
        final=_aligned([data.final[i] for i in index], offsets, width).to(device),
        aux=aux, positions=positions.to(device), lengths=torch.tensor(lengths, device=device), active=active,
    )
