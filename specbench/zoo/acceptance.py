"""Measured Medusa acceptance of a zoo build: greedy decoding through the project's own engine
(HFTarget + MedusaProposer + Decoder), the numbers the suites will gate."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.metrics import SpecCounters
from specbench.proposers.medusa import MedusaProposer
from specbench.medusa.heads import MedusaHeads


def measure_medusa_acceptance(
    model: PreTrainedModel,
    heads: MedusaHeads,
    prompts: Sequence[Sequence[int]],
    settings: dict[str, dict],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    progress: bool = True,
) -> dict[str, dict]:
    """For each named proposer setting (``{"num_speculative_tokens": 3}`` or ``{"tree": paths}``),
    greedy-decode every prompt (stopping at EOS) and pool the counters. Each entry holds the
    acceptance rate, mean acceptance length, per-position rates and ``outputs_match_first``:
    whether every output equals the first setting's (greedy verification is lossless, so in fp32
    a mismatch means an engine or checkpoint bug)."""
    target = HFTarget(model)
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=(eos_token_id,))
    results: dict[str, dict] = {}
    reference_outputs: list[list[int]] | None = None
    for name, options in settings.items():
        proposer = MedusaProposer(heads, target.lm_head, **options)
        decoder = Decoder(target, proposer, config)
        total, outputs = SpecCounters(), []
        for ids in tqdm(prompts, desc=f"acceptance {name}", disable=not progress):
            result = decoder.generate(torch.tensor(ids, dtype=torch.long))
            total = total.merge(result.counters)
            outputs.append(result.output_token_ids)
        reference_outputs = reference_outputs if reference_outputs is not None else outputs
        results[name] = {
            "acceptance_rate": total.acceptance_rate,
            "mean_acceptance_length": total.mean_acceptance_length,
            "per_position_acceptance_rate": total.per_position_acceptance_rate,
            "num_drafts": total.num_drafts,
            "num_output_tokens": sum(len(o) for o in outputs),
            "outputs_match_first": outputs == reference_outputs,
        }
    return results
