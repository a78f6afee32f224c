"""Medusa heads as an nn.Module: per head, L residual blocks then a vocab projection (docs/checkpoints.md).

Head i reads the target's final hidden state at position t and predicts token t + i + 2 (the
target's own lm_head predicts t + 1). "Version 2" heads have no vocab projection of their own and
reuse the target's lm_head.

For decoding, :meth:`MedusaHeads.stack` lays every head's weights out as stacked tensors (the
per-head parameters become views into them, as FusedLinear does in engine/static_llama.py), so the
first K heads run as L batched matmuls plus one for the vocab projection (:class:`StackedHeads`).
Training keeps using the per-head modules (:meth:`MedusaHeads.forward`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from specbench.checkpoints.medusa_config import MedusaHeadsConfig


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)); the Linear has a bias and starts at zero (identity block)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))  # (..., H)


class StackedHeads(NamedTuple):
    """All heads' weights as stacked tensors (the per-head parameters are views into them)."""

    block_weight: torch.Tensor  # (heads, L, H, H): block l of head h is Linear(weight=[h, l], bias=block_bias[h, l])
    block_bias: torch.Tensor  # (heads, L, H)
    vocab_weight: torch.Tensor | None  # (heads, V, H); None for version-2 heads

    def hidden(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        """(..., H) hidden states -> (depth, ..., H) outputs of the first ``depth`` heads' residual blocks."""
        lead, size = x.shape[:-1], x.shape[-1]
        h = x.reshape(1, -1, size).expand(depth, -1, -1)  # (depth, N, H)
        for layer in range(self.block_weight.shape[1]):
            weight = self.block_weight[:depth, layer].transpose(1, 2)  # (depth, H in, H out)
            bias = self.block_bias[:depth, layer].unsqueeze(1)  # (depth, 1, H)
            h = h + F.silu(torch.baddbmm(bias, h, weight))  # (depth, N, H)
        return h.reshape(depth, *lead, size)

    def logits(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        """(..., H) hidden states -> (depth, ..., V) logits of the first ``depth`` heads (own vocab projections)."""
        if self.vocab_weight is None:
            raise ValueError("these Medusa heads have no vocab projection (version 2); project hidden() with the target's lm_head")
        h = self.hidden(x, depth)  # (depth, ..., H)
        lead = h.shape[1:-1]
        out = torch.bmm(h.reshape(depth, -1, h.shape[-1]), self.vocab_weight[:depth].transpose(1, 2))  # (depth, N, V)
        return out.reshape(depth, *lead, out.shape[-1])


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaHeadsConfig):
        super().__init__()
        self.config = config
        self._stacked: StackedHeads | None = None  # filled by stack()
        self._stacked_views: list[tuple[nn.Module, str, int]] = []  # (module, parameter name, data_ptr) at stack()
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
            for _ in range(config.num_heads)
        )
        self.lm_heads = (
            nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_heads))
            if config.has_vocab_projection
            else None
        )

    def forward(self, hidden_states: torch.Tensor, base_lm_head: nn.Module | None = None) -> torch.Tensor:
        """(..., H) final hidden states -> (num_heads, ..., V) logits."""
        if self.lm_heads is None and base_lm_head is None:
            raise ValueError("these Medusa heads have no vocab projection (version 2); pass the target's lm_head")
        logits = []
        for h, blocks in enumerate(self.blocks):
            x = blocks(hidden_states)  # (..., H)
            projection = self.lm_heads[h] if self.lm_heads is not None else base_lm_head
            logits.append(projection(x))  # (..., V)
        return torch.stack(logits)  # (num_heads, ..., V)

    def init_from_lm_head(self, lm_head_weight: torch.Tensor) -> None:
        """Start every vocab projection from the target's lm_head (Medusa's initialisation)."""
        if self.lm_heads is not None:
            for projection in self.lm_heads:
                projection.weight.data.copy_(lm_head_weight)

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .half() ... replace the parameters: drop the stacked tensors so that they
        # are not kept alive on the old device or dtype; stack() builds them again when next asked
        self._stacked, self._stacked_views = None, []
        return super()._apply(fn, *args, **kwargs)

    def _stack_targets(self) -> list[tuple[nn.Module, str, int, int | None]]:
        """(module, parameter name, head, layer or None for the vocab projection) of every stacked parameter."""
        targets = []
        for h, blocks in enumerate(self.blocks):
            for l, block in enumerate(blocks):
                targets += [(block.linear, "weight", h, l), (block.linear, "bias", h, l)]
            if self.lm_heads is not None:
                targets.append((self.lm_heads[h], "weight", h, None))
        return targets

    def stack(self) -> StackedHeads:
        """The heads' weights as stacked tensors, with every per-head parameter turned into a view of them.

        Idempotent: the stacked tensors are kept and returned again while every parameter is still
        the view it was made (in-place updates, such as an optimizer's or init_from_lm_head's, keep
        them so). When a parameter was replaced since (``.to()`` to another device or dtype,
        ``load_state_dict(assign=True)``), the heads are stacked afresh. The state dict keeps its
        names, shapes and values, and no weight is held twice: each parameter is copied into the
        stacked tensor and then replaced by its view, so stacking needs one extra head's worth of
        memory at most while it runs. Parameters keep their requires_grad.
        """
        if self._stacked is not None and all(
            module._parameters.get(name) is not None and module._parameters[name].data_ptr() == ptr
            for module, name, ptr in self._stacked_views
        ):
            return self._stacked
        config = self.config
        first = next(self.parameters())
        if any(p.dtype != first.dtype or p.device != first.device for p in self.parameters()):
            raise ValueError("cannot stack Medusa heads whose parameters differ in dtype or device; .to() one of each first")
        heads, layers, hidden = config.num_heads, config.num_layers, config.hidden_size
        # not an inference tensor (stack() may run under inference_mode): the views must stay trainable
        with torch.inference_mode(False), torch.no_grad():
            make = dict(dtype=first.dtype, device=first.device)
            stacked = StackedHeads(
                block_weight=torch.empty(heads, layers, hidden, hidden, **make),
                block_bias=torch.empty(heads, layers, hidden, **make),
                vocab_weight=torch.empty(heads, config.vocab_size, hidden, **make) if self.lm_heads is not None else None,
            )
            views = []
            for module, name, h, l in self._stack_targets():
                if l is None:
                    view = stacked.vocab_weight[h]  # (V, H)
                else:
                    view = (stacked.block_weight if name == "weight" else stacked.block_bias)[h, l]  # (H, H) or (H,)
                old = module._parameters[name]
                view.copy_(old)
                setattr(module, name, nn.Parameter(view, requires_grad=old.requires_grad))
                views.append((module, name, view.data_ptr()))
        self._stacked, self._stacked_views = stacked, views
        return stacked
