"""The EAGLE-3 draft head: ``fc`` fuses three target layers' features, one Llama layer over
``cat(input_layernorm(embed), hidden_norm(hidden))`` with the fused hidden as residual, its own norm and lm_head
over a draft vocabulary mapped to target ids by ``d2t`` (docs/eagle.md#eagle-3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specbench.eagle.draft_head import EagleConfig, EagleDecoderLayer, EagleHead
from specbench.engine.static_llama import LlamaShape, RMSNorm, rope_inv_freq
from specbench.engine.static_ops import EAGER_OPS, StepOps

# how many target layers fc fuses (docs/eagle.md#eagle-3)
NUM_AUX_LAYERS = 3


def eagle3_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose entering residual streams EAGLE-3 reads: (2, L // 2, L - 3), clamped to [0, L - 1]
    so tiny targets still have three (possibly repeated) layers."""
    if num_layers < 1:
        raise ValueError(f"a target of {num_layers} layers has no features for EAGLE-3")
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))  # type: ignore[return-value]


@dataclass(frozen=True)
class Eagle3Config(EagleConfig):
    """EagleConfig plus the draft vocabulary; ``bias`` is always False (EAGLE-3's fc has none)."""

    draft_vocab_size: int = 0  # 0: the target's vocab_size
    norm_before_residual: bool = False  # the residual is hidden_norm(hidden), not hidden (speculators' flag)

    def __post_init__(self):
        if not self.draft_vocab_size:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        object.__setattr__(self, "bias", False)

    @classmethod
    def from_eagle(cls, config: EagleConfig, draft_vocab_size: int = 0, norm_before_residual: bool = False) -> "Eagle3Config":
        return cls(**{**asdict(config), "draft_vocab_size": draft_vocab_size, "norm_before_residual": norm_before_residual})

    def to_json(self) -> dict:
        raw = {k: v for k, v in super().to_json().items() if k != "bias"}
        raw = {**raw, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": self.draft_vocab_size}
        return {**raw, "norm_before_residual": True} if self.norm_before_residual else raw


class Eagle3DecoderLayer(EagleDecoderLayer):
    """EAGLE-3's ``midlayer``: q/k/v read ``cat(input_layernorm(embed), hidden_norm(hidden))`` (2H wide); the
    residual is ``hidden``, or ``hidden_norm(hidden)`` with ``norm_before_residual``."""

    def __init__(self, shape: LlamaShape, *, norm_before_residual: bool = False):
        super().__init__(shape)
        self.norm_before_residual = norm_before_residual
        attn, wide = self.self_attn, 2 * shape.hidden_size
        attn.q_proj = nn.Linear(wide, shape.num_heads * shape.head_dim, bias=False)
        attn.k_proj = nn.Linear(wide, shape.num_kv_heads * shape.head_dim, bias=False)
        attn.v_proj = nn.Linear(wide, shape.num_kv_heads * shape.head_dim, bias=False)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, embeds, hidden, cos, sin, kv, slots, bias, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """``embeds``, ``hidden`` (W, H); the residual is ``hidden`` (fc's output or the parent's draft output)."""
        emb_norm, hid_norm = self.input_layernorm, self.hidden_norm
        normed_hidden = ops.rms_norm(hidden, hid_norm.weight, hid_norm.eps)  # (W, H)
        x = torch.cat([ops.rms_norm(embeds, emb_norm.weight, emb_norm.eps), normed_hidden], dim=-1)  # (W, 2H)
        attn = self.self_attn(x, cos, sin, kv, slots, bias, ops)  # (W, H)
        post = self.post_attention_layernorm
        residual = normed_hidden if self.norm_before_residual else hidden
        h, normed = ops.add_rms_norm(residual, attn, post.weight, post.eps)  # (W, H) each
        return h + self.mlp(normed, ops)  # (W, H): pre-norm, fed back as the next depth's hidden


class Eagle3Head(EagleHead):
    """Parameter and buffer names are the published keys (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``,
    ``t2d``); ``embed_tokens`` is None (the target's embedding serves) unless ``with_embed`` (a vLLM/speculators
    head shipping its own). The forward and caches are EagleHead's."""

    def __init__(self, config: Eagle3Config, *, with_vocab_map: bool = True, with_embed: bool = False):
        nn.Module.__init__(self)  # not EagleHead.__init__: the layer, fc and norms differ
        self.config = config
        self.shape = config.shape()
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if with_embed else None
        self.fc = nn.Linear(NUM_AUX_LAYERS * hidden, hidden, bias=False)
        self.midlayer = Eagle3DecoderLayer(self.shape, norm_before_residual=config.norm_before_residual)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        if with_vocab_map:  # target id = draft id + d2t[draft id]; t2d marks the target ids drafted
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
            t2d[: config.draft_vocab_size] = True  # consistent with d2t = 0: the first draft_vocab_size ids
            self.register_buffer("t2d", t2d)
        else:
            self.d2t = self.t2d = None
        self.inv_freq = rope_inv_freq(self.shape)  # (D/2,) fp32 plain attribute

    def draft_to_target(self) -> torch.Tensor:
        """(Vd,) the target id of each draft id."""
        ids = torch.arange(self.config.draft_vocab_size, device=self.lm_head.weight.device)
        return ids if self.d2t is None else ids + self.d2t.to(ids.device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(W, Vd) fp32 draft-vocabulary logits of pre-norm outputs ``hidden`` (W, H)."""
        normed = EAGER_OPS.rms_norm(hidden, self.norm.weight, self.norm.eps)
        return self.lm_head(normed).float()

    @property
    def layer(self) -> Eagle3DecoderLayer:
        return self.midlayer

    def step(self, embeds, features, positions, slots, mask, kv, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """EagleHead.step's contract; ``features`` (W, 3H) are the target's aux features, through fc first (as
        upstream dispatches on the width), (W, H) the draft's own outputs at the parents, as they are."""
        hidden = features.to(embeds.dtype)
        if hidden.shape[-1] != embeds.shape[-1]:
            hidden = self.fc(hidden)  # (W, H) the fused target features
        cos, sin = ops.rotary_tables(self.inv_freq, positions, hidden.dtype)  # (W, D) each
        return self.midlayer(embeds, hidden, cos, sin, kv, slots, ops.attention_bias(mask, hidden.dtype), ops)  # (W, H)

