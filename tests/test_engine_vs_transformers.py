"""The one static engine against transformers itself, with no reference target of this project between them: every
proposer of the shipped reference family, at B = 1 and with three slots over four GSM8K prompts (refills, EOS at
different steps), decodes each prompt as transformers' greedy ``generate`` does; n-gram equals its prompt-lookup
generation and the draft model its assisted generation too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from specbench.checkpoints.resolve import load_target_model, resolve_model_dir
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_target import StaticTarget
from specbench.prompts import load_prompts
from specbench.proposers import create_proposer

REF = "specbench-ref/gsm8k-tiny"
MAX_NEW = 40
PROPOSERS = {  # label: (proposer name, options)
    "plain": None,
    "ngram-k3": ("ngram", {"num_speculative_tokens": 3}),
    "draft-k3": ("draft", {"path": f"{REF}-draft", "num_speculative_tokens": 3}),
    "medusa-chain-k3": ("medusa", {"path": f"{REF}-medusa", "num_speculative_tokens": 3}),
    "medusa-tree-63": ("medusa", {"path": f"{REF}-medusa", "tree": "gsm8k-tiny-63"}),
    "eagle-chain-k3": ("eagle", {"path": f"{REF}-eagle", "num_speculative_tokens": 3}),
    "eagle-dynamic": ("eagle", {"path": f"{REF}-eagle", "top_k": 4, "depth": 4, "total_tokens": 16}),
    "eagle3-chain-k3": ("eagle3", {"path": f"{REF}-eagle3", "num_speculative_tokens": 3}),
    "eagle3-dynamic": ("eagle3", {"path": f"{REF}-eagle3", "top_k": 3, "depth": 5, "total_tokens": 12}),
}


@pytest.fixture(scope="module")
def transformers_side():
    """The reference model, its draft, four prompts, an EOS two of them reach, and generate's greedy outputs."""
    model = load_target_model(REF, dtype=torch.float32, device="cpu")
    draft = load_target_model(f"{REF}-draft", dtype=torch.float32, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(REF))
    prompts = [torch.tensor(p.token_ids) for p in load_prompts("gsm8k-embedded", num_prompts=4, tokenizer=tokenizer)]
    free = [generate(model, p, eos=None) for p in prompts]
    eos = free[0][MAX_NEW // 2]  # a token the first prompt emits halfway: some requests stop early, some do not
    outputs = [generate(model, p, eos) for p in prompts]
    assert len({len(o) for o in outputs}) > 1 and any(len(o) == MAX_NEW for o in outputs)  # EOS at different steps
    return model, draft, prompts, eos, outputs


def generate(model, prompt, eos, **options) -> list[int]:
    """transformers' greedy generation of ``prompt`` alone: its new tokens, the EOS that ends them included."""
    ids = prompt[None]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                         eos_token_id=eos, pad_token_id=0, **options)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("label", sorted(PROPOSERS))
@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_static_engine_decodes_as_transformers_generate(transformers_side, label, batch_size):
    model, _, prompts, eos, outputs = transformers_side
    target = StaticTarget.from_hf_model(model, batch_size=batch_size)
    proposer = PROPOSERS[label] and create_proposer(PROPOSERS[label][0], target, **PROPOSERS[label][1])
    decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,)))
    results = decoder.generate_all(prompts)
    assert [r.output_token_ids for r in results] == outputs
    assert [r.finish_reason for r in results] == ["eos" if o[-1] == eos else "length" for o in outputs]
    assert decoder.stats.num_refills == len(prompts) - batch_size
    accepted = sum(r.counters.num_accepted_tokens for r in results)
    assert (accepted > 0) == (label != "plain")  # every trained proposer agrees with the target somewhere


def test_ngram_and_draft_equal_transformers_prompt_lookup_and_assisted_generation(transformers_side):
    """transformers' own speculative paths (one sequence each) give generate's tokens, so the previous test's
    comparison covers them too; checked here so that a transformers change there is seen."""
    model, draft, prompts, eos, outputs = transformers_side
    for prompt, output in zip(prompts, outputs):
        assert generate(model, prompt, eos, prompt_lookup_num_tokens=3) == output
        assert generate(model, prompt, eos, assistant_model=draft) == output
