"""Draft-model proposer: lossless on both engines, equal to transformers' assisted generation, an on-paper
replay when the draft is the target itself, a refused vocabulary mismatch, and the target distribution
kept at temperature > 0 (chi-square over the first two tokens)."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.checkpoints.resolve import load_target_model
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.static_target import StaticTarget
from specbench.proposers import create_proposer
from specbench.proposers.draft_model import DraftModelProposer
from test_decode_lossless import predicted_counts

TARGET, DRAFT = "specbench-ref/gsm8k-tiny", "specbench-ref/gsm8k-tiny-draft"
MAX_NEW = 40


@pytest.fixture(scope="module")
def reference():
    return load_target_model(TARGET, dtype=torch.float32, device="cpu"), load_target_model(DRAFT, dtype=torch.float32, device="cpu")


def prompts(model, n=3):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, model.config.vocab_size, (12 + 5 * i,), generator=gen) for i in range(n)]


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_greedy_drafts_decode_exactly_as_plain_decoding(reference, engine):
    model, _ = reference
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    proposer = create_proposer("draft", target, path=DRAFT, num_speculative_tokens=4)
    assert type(proposer.draft) is type(target)  # the draft runs on the target's engine
    accepted = 0
    for prompt in prompts(model):
        plain = Decoder(target, None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
        spec = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
        assert spec.output_token_ids == plain.output_token_ids
        accepted += spec.counters.num_accepted_tokens
    assert accepted > 0  # the shipped draft agrees with the target somewhere: the catch-up path is exercised


def test_tokens_equal_transformers_assisted_generation(reference):
    """An implementation nobody here wrote: generate(assistant_model=...) and plain generate, greedy."""
    model, draft = reference
    target = HFTarget(model)
    proposer = DraftModelProposer.from_options(target, draft=HFTarget(draft), num_speculative_tokens=3)
    for prompt in prompts(model, 2):
        ids = prompt[None]
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False)
        plain = model.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()
        assisted = model.generate(ids, assistant_model=draft, **kwargs)[0, ids.shape[1]:].tolist()
        ours = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)).generate(prompt)
        assert assisted == plain == ours.output_token_ids


def test_the_target_as_its_own_draft_matches_the_paper_replay(reference):
    """Every draft token is the target's own greedy choice, so all K are accepted at every step."""
    model, _ = reference
    target = HFTarget(model)
    proposer = DraftModelProposer.from_options(target, draft=HFTarget(model), num_speculative_tokens=3)
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)).generate(prompts(model)[0])
    drafts, accepted, per_position = predicted_counts(3, set(), MAX_NEW)
    c = result.counters
    assert (c.num_drafts, c.num_accepted_tokens, c.accepted_per_position) == (drafts, accepted, per_position)


def test_a_draft_of_another_vocabulary_is_refused_naming_both_sizes(reference):
    model, _ = reference
    other = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match=r"vocabulary of 100 tokens but the target's has \d+: a draft model must share"):
        DraftModelProposer.from_options(HFTarget(model), draft=HFTarget(other), num_speculative_tokens=2)


def tiny(seed: int, vocab: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def test_sampled_drafts_keep_the_target_distribution_over_two_tokens():
    """Target and draft are different random models over 6 tokens; both sample at temperature 1. The joint
    law of the first two output tokens must be the target's own, p(a) p(b | a): with 3,000 runs over 36 cells
    a correct rule's p-value is uniform, and a broken one (e.g. accepting every draft) is far below 1e-3."""
    target_model, draft_model = tiny(0), tiny(1)
    target = HFTarget(target_model)
    proposer = DraftModelProposer.from_options(target, draft=HFTarget(draft_model), num_speculative_tokens=2,
                                               temperature=1.0)
    prompt = torch.tensor([1, 4, 2])
    config = GenerationConfig(max_new_tokens=2, sampling=SamplingParams(temperature=1.0), ignore_eos=True)
    decoder = Decoder(target, proposer, config)
    counts = torch.zeros(6, 6)
    for seed in range(3000):
        proposer.seed = seed + 100_000  # the draft's own draws vary too
        a, b = decoder.generate(prompt, seed=seed).output_token_ids[:2]
        counts[a, b] += 1
    with torch.inference_mode():
        first = torch.softmax(target_model(prompt[None]).logits[0, -1], -1)  # (6,)
        expected = torch.stack([torch.softmax(target_model(torch.cat([prompt, torch.tensor([a])])[None]).logits[0, -1], -1)
                                * first[a] for a in range(6)])  # (6, 6)
    cells = [(a, b) for a, b in itertools.product(range(6), range(6)) if expected[a, b] * 3000 >= 5]
    observed = torch.tensor([counts[a, b] for a, b in cells])
    wanted = torch.tensor([float(expected[a, b]) for a, b in cells])
    wanted = wanted / wanted.sum() * observed.sum()
    assert chisquare(observed.numpy(), wanted.numpy()).pvalue > 1e-3
