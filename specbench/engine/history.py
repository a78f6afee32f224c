"""Every slot's device history in the decode loop (engine/decode.py): tokens, the hidden state that predicted the
last one and a feature reader's hidden states, appended for all B slots by a few device ops per step, no host read."""

from __future__ import annotations

import torch

from specbench.engine.device_verification import BatchVerdict


class History:
    """Every slot's device history, updated for all B slots by a few device ops per step (no host read)."""

    def __init__(self, batch_size: int, capacity: int, device: torch.device):
        self.tokens = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)  # (B, C) prompt + emitted
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,) tokens[b, :lengths[b]] is live
        self.hidden: torch.Tensor | None = None  # (B, H) the target's hidden state that predicted each last token
        self.features: torch.Tensor | None = None  # (B, C, F) row i predicted tokens[b, i + 1] (feature readers)

    def admit(self, slot: int, prompt: torch.Tensor, first: int, hidden: torch.Tensor,
              features: torch.Tensor | None) -> None:
        """Slot ``slot`` starts a request: prompt ``(T,)``, its first token, hidden ``(H,)``, features ``(T, F)``."""
        length = prompt.numel()
        self.tokens[slot, :length] = prompt
        self.tokens[slot, length] = first
        self.lengths[slot] = length + 1
        if self.hidden is None:
            self.hidden = hidden.new_zeros(self.tokens.shape[0], hidden.numel())  # (B, H)
        self.hidden[slot] = hidden
        if features is not None:
            if self.features is None:
                self.features = features.new_zeros(*self.tokens.shape, features.shape[-1])  # (B, C, F)
            self.features[slot, :length] = features

    def ensure(self, needed: int) -> None:
        """Room for ``needed`` tokens per row (a proposer drafting beyond its max_draft_tokens grows it)."""
        grow = needed - self.tokens.shape[1]
        if grow > 0:
            self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(self.tokens.shape[0], grow)], dim=1)
            if self.features is not None:
                self.features = torch.cat([self.features, self.features.new_zeros(
                    self.features.shape[0], grow, self.features.shape[2])], dim=1)

    def record(self, verdict: BatchVerdict, out) -> None:
        """Append each slot's emitted tokens, the hidden state after its path and its path's features."""
        _write_rows(self.tokens, self.lengths, verdict.emitted, verdict.kept)
        hidden = out.hidden_states  # (B, W, H) the verify's own tensor (a target hands out copies of graph outputs)
        if hidden.shape[1] == 1:  # a plain step: every path ends at node 0
            self.hidden = hidden[:, 0]  # (B, H)
        else:
            last = verdict.last_node()[:, None, None]  # (B, 1, 1)
            self.hidden = hidden.gather(1, last.expand(-1, 1, hidden.shape[-1])).squeeze(1)  # (B, H)
        if self.features is not None:  # the accepted path's hidden states predicted the tokens emitted now
            source = out.aux_hidden_states if out.aux_hidden_states is not None else hidden  # (B, W, F)
            picked = source.gather(1, verdict.nodes[:, :, None].expand(-1, -1, source.shape[-1]))  # (B, W, F)
            _write_rows(self.features, self.lengths - 1, picked, verdict.kept)
        self.lengths.add_(verdict.kept)  # (B,)


def _write_rows(buffer: torch.Tensor, start: torch.Tensor, values: torch.Tensor, count: torch.Tensor) -> None:
    """``buffer[b, start[b] + i] = values[b, i]`` for ``i < count[b]``, every row at once and without a host read:
    ``buffer`` ``(B, C, ...)``, ``start`` and ``count`` ``(B,)``, ``values`` ``(B, W, ...)``; other cells unchanged."""
    batch, width = values.shape[:2]
    offsets = torch.arange(width, device=values.device)  # (W,)
    shape = (batch, width) + (1,) * (values.dim() - 2)
    index = (start[:, None] + offsets).clamp(0, buffer.shape[1] - 1).view(shape).expand_as(values)  # (B, W, ...)
    live = (offsets < count[:, None]).view(shape)  # (B, W, 1...)
    buffer.scatter_(1, index, torch.where(live, values, buffer.gather(1, index)))
