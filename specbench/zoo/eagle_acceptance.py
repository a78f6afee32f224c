"""The EAGLE stage's measurement: greedy decoding of the evaluation prompts plainly and with each way the family
drafts, pooled into the build record's acceptance figures (docs/zoo.md#eagle-heads)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.metrics import SpecCounters
from specbench.proposers import create_proposer


def _decode_all(decoder: Decoder, prompts: list[list[int]], desc: str, progress: bool) -> tuple[SpecCounters, list, float]:
    total, outputs, begin = SpecCounters(), [], time.perf_counter()
    for ids in tqdm(prompts, desc=desc, disable=not progress):
        result = decoder.generate(torch.tensor(ids, dtype=torch.long))
        total = total.merge(result.counters)
        outputs.append(result.output_token_ids)
    return total, outputs, time.perf_counter() - begin


def measure_acceptance(directory: Path, model, prompts: list[list[int]], max_new_tokens: int,
                       settings: dict[str, tuple[str, str, dict]], progress: bool) -> dict:
    """Greedy decoding of ``prompts`` (stop at EOS) plainly and with each of ``settings`` (name -> (proposer, head
    directory, options)), through the real proposers loading the heads from ``directory``; a fresh HFTarget over
    ``model`` each (EAGLE-3 sets the target's aux layers)."""
    eos = model.generation_config.eos_token_id
    generation = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_ids=(eos,))
    _, plain, plain_s = _decode_all(Decoder(HFTarget(model), None, generation), prompts, "plain", progress)
    tokens = sum(map(len, plain))
    results = {"plain": {"num_output_tokens": tokens, "wall_s": plain_s, "tokens_per_s": tokens / plain_s}}
    for name, (proposer_name, head_dir, options) in settings.items():
        target = HFTarget(model)
        proposer = create_proposer(proposer_name, target, path=str(directory / head_dir), **options)
        total, outputs, wall = _decode_all(Decoder(target, proposer, generation), prompts, name, progress)
        tokens = sum(map(len, outputs))
        results[name] = {
            "proposer": proposer.describe(), "acceptance_rate": total.acceptance_rate,
            "mean_acceptance_length": total.mean_acceptance_length,
            "per_position_acceptance_rate": total.per_position_acceptance_rate, "num_drafts": total.num_drafts,
            "num_draft_tokens": total.num_draft_tokens, "num_accepted_tokens": total.num_accepted_tokens,
            "num_output_tokens": tokens, "outputs_match_plain": outputs == plain, "wall_s": wall,
            "tokens_per_s": tokens / wall,
        }
    return results
