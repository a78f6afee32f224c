"""``specbench zoo synth``: write a random but decisive Llama (Vicuna-7B, Llama-3.2-1B-like or tiny shape), 5 random
Medusa heads and 5 "profile" Medusa heads of known per-head accuracy, all in the exact upstream layout, so the GPU
tier exercises 7B-scale loading and decoding, and speculative decoding at a known acceptance, without a download.

The weights are random but *decisive*: with i.i.d. N(0, 0.02) weights everywhere, the 32,000 logits
are near-ties and bf16's different rounding for a k-token verification flips the greedy argmax
within a few dozen tokens (measured on the H200: bf16 tree-63 match fraction 0.19, and an oracle
proposing the plain greedy continuation reached MAL 1.06 of a possible 4). So the embeddings are
drawn large (std DECISIVE_EMBED_STD, dominating the residual stream) and the lm_head maps each
ordinary token to its successor on a random cycle over the vocabulary (top logit ~sqrt(hidden),
the rest ~N(0, 1)). Every matrix keeps its shape, dtype and cost; greedy decoding just has margins
that rounding cannot flip, so bf16 lossless checks and oracle speed figures mean something.

``medusa/`` holds random heads (non-zero biases; acceptance meaningless, never gated). ``medusa-profile/``
holds heads built the same way as the lm_head: identity residual blocks (weight and bias 0), and head h's
vocab projection sends each ordinary token t to succ^(h+2)(t), the token h + 2 steps on along the cycle
(what head h predicts, docs/checkpoints.md), except for a random round((1 - p_h) * N) of the N ordinary
tokens, which are sent to a wrong token instead. So head h's top-1 is right for exactly those tokens, with
the lm_head's wide margins; the wrong sets are drawn independently per head, so a chain's position i is
accepted, given position i - 1 was, with probability p_i (synth_record.json: expected_per_position_acceptance).
Only top-1 is shaped: a head's lower ranks are noise, so a tree gains nothing over its top-1 path.

``eagle-profile/`` (EAGLE-1/2 layout), ``eagle3-profile/`` (EAGLE-3, SafeAILab layout) and ``draft-profile/`` (a
decisive Llama-3.2-1B-like draft beside the 7B) continue every token along the target's cycle except a planned set
of misses, laid along the cycle so that greedy drafting accepts exactly a published per-position profile
(zoo/synth_proposers.py; docs/zoo.md#proposer-profiles).
"""

from __future__ import annotations

import argparse

from specbench.zoo.acceptance_profiles import DRAFT_QWEN3_K3, EAGLE2_VICUNA_7B, EAGLE3_LLAMA_31_8B_K3

# lmsys/vicuna-7b-v1.3's architecture (Llama-7B)
VICUNA_7B_SHAPE = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
)
# Llama-3.2-1B's decoder (GQA: 8 key/value heads for 32 query heads) with Vicuna's 32,000 vocabulary, untied
LLAMA_1B_SHAPE = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-5,
)
# a miniature of the 7B layout (tests, CPU); the rest as VICUNA_7B_SHAPE
TINY_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
SHAPES = {"7b": VICUNA_7B_SHAPE, "1b": LLAMA_1B_SHAPE, "tiny": {**VICUNA_7B_SHAPE, **TINY_SHAPE}}
# Medusa-1 on Vicuna-7B: the published per-head top-1 accuracies (the Medusa paper; README's zoo table)
MEDUSA_1_VICUNA_7B_TOP1 = (0.56, 0.32, 0.20, 0.15, 0.12)


def accuracy_list(text: str) -> tuple[float, ...]:
    """argparse type of --head-accuracy: comma-separated probabilities in [0, 1]."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(0.0 <= v <= 1.0 for v in values):  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"expected comma-separated probabilities in [0, 1] (e.g. 0.56,0.32,0.20), got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="where target/, medusa/, medusa-profile/, eagle-profile/, eagle3-profile/ and "
                        "draft-profile/ are written")
    parser.add_argument("--device", default="cuda", help="where the random weights are drawn (cuda is much faster)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-medusa-heads", type=int, default=5)
    parser.add_argument("--shape", choices=list(SHAPES), default="7b",
                        help="7b: Vicuna-7B; 1b: Llama-3.2-1B-like (GQA) with a 32,000 vocabulary; tiny: tests, CPU")
    parser.add_argument("--tiny", dest="shape", action="store_const", const="tiny", help="the same as --shape tiny")
    parser.add_argument("--head-accuracy", type=accuracy_list, default=MEDUSA_1_VICUNA_7B_TOP1, metavar="P1,P2,...",
                        help="per-head top-1 accuracy of the medusa-profile/ heads, the last repeating "
                        "(default: Medusa-1 on Vicuna-7B, " + ",".join(map(str, MEDUSA_1_VICUNA_7B_TOP1)) + ")")
    for flag, default, directory, source in (
            ("--eagle-acceptance", EAGLE2_VICUNA_7B, "eagle-profile/", "EAGLE-2 on Vicuna-7B"),
            ("--eagle3-acceptance", EAGLE3_LLAMA_31_8B_K3, "eagle3-profile/", "vLLM's EAGLE-3 K=3 baseline"),
            ("--draft-acceptance", DRAFT_QWEN3_K3, "draft-profile/", "vLLM's Qwen3 draft-model reference")):
        parser.add_argument(flag, type=accuracy_list, default=default, metavar="P1,P2,...",
                            help=f"per-position acceptance {directory} is built to, non-increasing, as long as the depth "
                            f"it is drafted at (default: {source}, {','.join(map(str, default))}; "
                            "docs/zoo.md#proposer-profiles)")

