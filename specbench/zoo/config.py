"""Settings of a zoo build: the full-size GSM8K reference models (GPU, minutes) and a miniature
scale of the same pipeline for CPU tests. Every number that shapes the artifacts lives here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


# offsets from the build seed, one per random stream, so changing one stage never shifts another (the EAGLE stage's
# continue them: zoo/eagle_stage.py's EAGLE_SEED_OFFSETS)
SEED_OFFSETS = {"target_init": 0, "target_data": 1, "heads_init": 2, "heads_data": 3, "prefix_cuts": 4, "draft_init": 5,
                "draft_data": 6}


@dataclass(frozen=True)
class LlamaShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int  # documents per step
    seq_len: int  # longer documents are cut (they then lose their EOS)
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.1


@dataclass(frozen=True)
class ZooBuildConfig:
    name: str
    vocab_size: int
    max_context: int  # max_position_embeddings: prompt + 128 new tokens + a 63-node tree fit well inside
    target: LlamaShape
    target_training: TrainSettings
    draft: LlamaShape
    draft_training: TrainSettings
    num_train_records: int | None  # first N records of the train split; None = all
    num_heldout: int  # last train records, kept out of all training: held-out loss and head accuracy
    # the train records just before the held-out ones, never shown to the target and used only as
    # self-distillation prompts (0: distil on the target's own training questions). Measured on the
    # H200, 3,000 such records lowered the 63-node tree's expected MAL (1,500 target steps: 2.02 vs
    # 2.13 without; 900 steps: 2.17, below 1,000 steps without at 2.41): the target's loss of data
    # outweighs the better-matched prompts
    num_distill_only_records: int
    # Medusa-1 heads, trained on the frozen target's own greedy continuations
    medusa_num_heads: int
    medusa_num_layers: int
    # beyond one prompt per training question: question + a random cut of its reference answer, so
    # the heads see the target continue from mid-answer states too
    num_answer_prefix_prompts: int
    distill_max_new_tokens: int
    distill_batch_size: int
    heads_steps: int
    heads_batch_size: int
    heads_lr: float
    heads_decay: float  # head i's loss weight is heads_decay ** i (Medusa trained with 0.8)
    tree_sizes: tuple[int, ...]
    tree_top_k: int  # candidates per head measured for tree calibration
    # acceptance check: first N GSM8K test questions, zero-shot prompt, greedy, stop at EOS
    eval_num_prompts: int
    eval_max_new_tokens: int
    eval_chain_k: int
    weights_dtype: str  # dtype of the shipped weights ("bfloat16" keeps the zoo small)
    # what the build must reach to count as passed (None: not checked at this scale)
    min_chain_acceptance: float | None = None
    min_tree_mal: float | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)


# Size budget: all artifacts <= 25 MB. In bf16 a 5-head Medusa-1 checkpoint costs
# 5 * (h*h + h + h*V) * 2 bytes, so h = 384 with V = 4096 (the probe's target) would need 17 MB
# for the heads alone; h = 256, V = 2048 keeps target + heads + draft near 21 MB. Byte-level BPE
# on GSM8K saturates early: 2048 tokens cost ~10% longer documents than 4096 (181 vs 165 tokens).
FULL = ZooBuildConfig(
    name="gsm8k-tiny",
    vocab_size=2048,
    max_context=1024,
    target=LlamaShape(hidden_size=256, num_layers=8, num_heads=4, num_kv_heads=4, intermediate_size=688),
    # measured on the H200 (seed 0, 63-node tree MAL / chain K=3 acceptance on 80 test prompts):
    # 1,500 steps 2.13 / 0.177 (train loss 0.55, held-out 2.46: memorised), 1,000 steps 2.44 / 0.230,
    # 700 steps 2.66 / 0.255, 600 steps 2.75 / 0.278 (train loss 1.69, held-out 2.16; answers stay
    # fluent GSM8K-style text); shorter training memorises less and the target's continuations of
    # new questions become more predictable for the heads
    target_training=TrainSettings(steps=600, batch_size=64, seq_len=384, lr=2e-3, warmup_steps=100),
    draft=LlamaShape(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=344),
    draft_training=TrainSettings(steps=1500, batch_size=64, seq_len=384, lr=3e-3, warmup_steps=100),
    num_train_records=None,
    num_heldout=200,
    num_distill_only_records=0,
    medusa_num_heads=5,
    medusa_num_layers=1,
    num_answer_prefix_prompts=7000,
    distill_max_new_tokens=128,
    distill_batch_size=512,
    heads_steps=6000,
    heads_batch_size=1024,
    heads_lr=1e-3,
    heads_decay=0.8,
    tree_sizes=(63, 15),
    tree_top_k=10,
    eval_num_prompts=80,
    eval_max_new_tokens=128,
    eval_chain_k=3,
    weights_dtype="bfloat16",
    min_chain_acceptance=0.25,
    min_tree_mal=2.3,
)

# The same pipeline in seconds on a CPU: for tests of the plumbing, not of model quality.
TEST = ZooBuildConfig(
    name="gsm8k-tiny",
    vocab_size=300,
    max_context=512,
    target=LlamaShape(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64),
    target_training=TrainSettings(steps=30, batch_size=8, seq_len=96, lr=3e-3, warmup_steps=5),
    draft=LlamaShape(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32),
    draft_training=TrainSettings(steps=10, batch_size=8, seq_len=96, lr=3e-3, warmup_steps=2),
    num_train_records=200,
    num_heldout=8,
    num_distill_only_records=0,
    medusa_num_heads=2,
    medusa_num_layers=1,
    num_answer_prefix_prompts=8,
    distill_max_new_tokens=8,
    distill_batch_size=64,
    heads_steps=20,
    heads_batch_size=32,
    heads_lr=1e-3,
    heads_decay=0.8,
    tree_sizes=(63, 15),  # the registry's tree names; 2 heads x top-8 offer 8 + 64 nodes
    tree_top_k=8,
    eval_num_prompts=2,
    eval_max_new_tokens=8,
    eval_chain_k=2,
    weights_dtype="bfloat16",
)

SCALES = {"full": FULL, "test": TEST}
