"""The static engine at any batch size: every request of a run at B = 1, 2, 3 and B larger than the queue equals its
decode on the eager reference target (tokens and counters) for plain, n-gram, Medusa chain and tree and the draft
model, with mixed prompt lengths and EOS mid-run (slots refilled); sampled slots keep the target
distribution; bad batch sizes and caches that cannot fit are refused before anything is allocated."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from _random_heads import random_heads as shared_random_heads
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.proposer import PerSlotProposer
from specbench.engine.static_target import StaticTarget
from specbench.engine.step_inputs import SlotInput
from specbench.engine.proposer import for_batch
from specbench.medusa.heads import MedusaHeads
from specbench.proposers.draft_model import DraftModelProposer
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer
from specbench.proposers.scripted import ScriptedProposer
from _prompts import random_prompt, repetitive_prompt

VOCAB, HIDDEN = 256, 64
SMALL_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def tiny_llama_model(vocab: int = VOCAB, seed: int = 0) -> LlamaForCausalLM:
    # initializer_range 0.2: wide logit margins, so fp32 argmax never ties across summation orders
    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def random_heads(vocab: int = VOCAB, seed: int = 1) -> MedusaHeads:
    return shared_random_heads(HIDDEN, vocab, seed)


@pytest.fixture(scope="module")
def tiny():
    model = tiny_llama_model()
    # mixed lengths; two repetitive prompts so n-gram lookup drafts and gets accepted
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4)]
    return StaticTarget.from_hf_model(model), random_heads(), prompts


@pytest.fixture(scope="module")
def tiny_eager():
    """The eager reference target over the same tiny model (the exactness reference of every batch size)."""
    return HFTarget(tiny_llama_model())


def tiny_proposers(heads):
    return {
        "plain": lambda target: None,
        "ngram": lambda target: NgramProposer(num_speculative_tokens=3),
        "medusa-chain": lambda target: MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=3),
        "medusa-tree": lambda target: MedusaProposer.from_options(target, heads=heads, tree=SMALL_TREE),
    }


def decode_alone(target, proposer_for, prompts, config):
    """Each prompt alone on ``target`` (the eager reference, or a static target of batch size 1)."""
    return [Decoder(target, proposer_for(target), config).generate(p) for p in prompts]


def decode_batched(static, proposer_for, prompts, config, batch_size, factory=None):
    target = static.with_batch_size(batch_size)
    proposer = for_batch(proposer_for(static), batch_size, factory=factory)
    decoder = Decoder(target, proposer, config)
    return decoder.generate_all(prompts), decoder, target


def assert_each_request_as_alone(batched, alone) -> None:
    assert len(batched) == len(alone)
    for index, (got, want) in enumerate(zip(batched, alone)):
        assert got.output_token_ids == want.output_token_ids, f"request {index}"
        assert got.counters == want.counters, f"request {index}"  # drafts, draft/accepted tokens, per position, forwards
        assert got.finish_reason == want.finish_reason, f"request {index}"
        assert got.timing.num_output_tokens == want.timing.num_output_tokens
        assert got.timing.time_to_first_token_s > 0 and got.timing.total_s >= got.timing.time_to_first_token_s


def eos_mid_run(target, prompts, max_new: int) -> int:
    """A token the plain greedy outputs emit mid-run in some requests but not all, so EOS ends them at different steps."""
    plain = GenerationConfig(max_new_tokens=max_new)
    outputs = [r.output_token_ids for r in decode_alone(target, lambda t: None, prompts, plain)]
    for token in outputs[0][3:]:
        ends = [out.index(token) if token in out else None for out in outputs]
        if ends.count(None) and len({e for e in ends if e is not None}) >= 1 and ends[0] >= 3:
            return token
    raise AssertionError(f"no token ends some requests but not others: {outputs}")


@pytest.mark.parametrize("label", ["plain", "ngram", "medusa-chain", "medusa-tree"])
def test_tiny_model_requests_at_every_batch_size_equal_the_eager_reference(tiny, tiny_eager, label):
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    eos = eos_mid_run(tiny_eager, prompts, 20)
    config = GenerationConfig(max_new_tokens=20, eos_token_ids=(eos,))
    alone = decode_alone(tiny_eager, proposer_for, prompts, config)
    assert {r.finish_reason for r in alone} == {"eos", "length"}
    assert (sum(r.counters.num_drafts for r in alone) > 0) == (label != "plain")  # acceptance: the reference model's test
    assert_each_request_as_alone(decode_alone(static, proposer_for, prompts, config), alone)  # B = 1, one at a time
    for batch_size in (1, 2, 3, 7):  # 7 > the 5 prompts: idle slots from the start
        batched, decoder, target = decode_batched(static, proposer_for, prompts, config, batch_size)
        assert_each_request_as_alone(batched, alone)
        assert decoder.stats.num_admissions == len(prompts)
        assert decoder.stats.num_refills == max(0, len(prompts) - batch_size), batch_size  # refilled mid-run
        assert all(len(widths) == 1 for widths in target.verify_widths.values()), target.verify_widths
        assert max(decoder.stats.active_per_step) == min(batch_size, len(prompts))


def test_batch_of_one_equals_the_eager_reference_with_ignore_eos(tiny, tiny_eager):
    static, heads, prompts = tiny
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, eos_token_ids=(0,))
    proposer_for = tiny_proposers(heads)["medusa-tree"]
    batched, _, target = decode_batched(static, proposer_for, prompts, config, 1)
    assert_each_request_as_alone(batched, decode_alone(tiny_eager, proposer_for, prompts, config))
    assert all(r.finish_reason == "length" and len(r.output_token_ids) == 16 for r in batched)
    assert {r.slot for r in batched} == {0}


# --- the shipped reference model and its Medusa heads ---------------------------------------------------


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.prompts import load_prompts

    static = StaticTarget.from_pretrained("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("specbench-ref/gsm8k-tiny"))
    prompts = [torch.tensor(p.token_ids) for p in load_prompts("gsm8k-embedded", num_prompts=4, tokenizer=tokenizer)]
    heads = MedusaProposer.from_options(static, path="specbench-ref/gsm8k-tiny-medusa", num_speculative_tokens=3).heads
    config = GenerationConfig(max_new_tokens=48, eos_token_ids=(tokenizer.eos_token_id,))
    return static, heads, prompts, config


@pytest.fixture(scope="module")
def reference_eager():
    """The eager reference target over the reference model's checkpoint."""
    from specbench.checkpoints.resolve import load_target_model

    return HFTarget(load_target_model("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cpu"))


REFERENCE_PROPOSERS = {
    "plain": None, "ngram": None, "medusa-chain-k3": {"num_speculative_tokens": 3}, "medusa-tree-63": {"tree": "gsm8k-tiny-63"},
}


@pytest.mark.parametrize("label", sorted(REFERENCE_PROPOSERS))
def test_reference_model_requests_at_every_batch_size_equal_the_eager_reference(reference, reference_eager, label):
    static, heads, prompts, config = reference

    def proposer_for(target):
        if label == "ngram":
            return NgramProposer(num_speculative_tokens=3)
        options = REFERENCE_PROPOSERS[label]
        return options and MedusaProposer.from_options(target, heads=heads, **options)

    alone = decode_alone(reference_eager, proposer_for, prompts, config)
    assert {r.finish_reason for r in alone} == {"eos", "length"}  # EOS at different steps, one runs to the length
    assert (sum(r.counters.num_accepted_tokens for r in alone) > 0) == (label != "plain")
    assert_each_request_as_alone(decode_alone(static, proposer_for, prompts, config), alone)  # B = 1, one at a time
    for batch_size in (1, 3, 6) if label.startswith("medusa") else (2,):
        batched, decoder, _ = decode_batched(static, proposer_for, prompts, config, batch_size)
        assert_each_request_as_alone(batched, alone)
        assert decoder.stats.num_refills == max(0, len(prompts) - batch_size)


def test_tree_commits_gather_accepted_paths_per_slot(reference):
    """The 63-node tree accepts non-contiguous paths: the per-slot gather runs, and the results still equal the
    eager reference's (the previous test); here the gather's own effect on the cache rows is checked."""
    static, heads, prompts, _ = reference
    target = static.with_batch_size(2)
    target.reserve(128, 3)
    for slot, prompt in enumerate(prompts[:2]):
        target.prefill(slot, prompt[:20])
    before = target._cache.kv.clone()
    ids = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11])]
    target.verify([SlotInput(ids[0], torch.tensor([0, 1, 1, 2]), torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)), SlotInput(ids[1], torch.arange(3))])
    written = target._cache.kv.clone()
    target.commit([[0, 2, 3], [0, 1]])  # slot 0: node 1 dropped, nodes 2 and 3 moved down; slot 1: a chain prefix
    kv = target._cache.kv
    assert target._cache.host_lengths == [23, 22] and target._cache.lengths.tolist() == [23, 22]
    torch.testing.assert_close(kv[:, :, 0, :, 21:23], written[:, :, 0, :, 22:24], atol=0, rtol=0)
    torch.testing.assert_close(kv[:, :, :, :, :20], before[:, :, :, :, :20], atol=0, rtol=0)  # prompts untouched
    torch.testing.assert_close(kv[:, :, 1], written[:, :, 1], atol=0, rtol=0)  # slot 1 needed no move


def test_draft_model_of_b_slots_equals_the_eager_reference(reference, reference_eager):
    static, _, prompts, config = reference
    draft = StaticTarget.from_pretrained("specbench-ref/gsm8k-tiny-draft", dtype=torch.float32, device="cpu")

    def make(target=static):  # a draft-model proposer with its own draft cache over the shared draft weights
        return DraftModelProposer.from_options(target, draft=StaticTarget(draft.module, draft.config),
                                               num_speculative_tokens=3)

    alone = decode_alone(reference_eager, make, prompts[:3], config)
    assert sum(r.counters.num_accepted_tokens for r in alone) > 0
    batched, decoder, _ = decode_batched(static, make, prompts[:3], config, 2)
    assert isinstance(decoder.proposer, DraftModelProposer) and decoder.proposer.draft.batch_size == 2
    assert_each_request_as_alone(batched, alone)
    assert decoder.stats.num_refills == 1


def test_a_proposer_without_a_batched_form_needs_a_factory(reference):
    static, _, _, _ = reference
    # the scripted oracle has no batched form (the draft model, greedy or sampled, has: tests/test_batched_draft.py)
    scripted = ScriptedProposer(truth=[5, 6, 7], num_speculative_tokens=2, vocab_size=static.vocab_size)
    with pytest.raises(ValueError, match=r"ScriptedProposer keeps per-request state .* pass factory="):
        for_batch(scripted, 2)
    per_slot = for_batch(scripted, 2, factory=lambda: ScriptedProposer([5, 6, 7], 2, static.vocab_size))
    assert isinstance(per_slot, PerSlotProposer) and len(per_slot.proposers) == 2


# --- sampling: each slot keeps the target distribution ------------------------------------------------------

SAMPLING_VOCAB = 6
SAMPLED_REQUESTS = 1_500  # per prompt
# A correct sampler gives chi-square p-values spread uniformly on (0, 1): failing below 1e-3 flakes once in a
# thousand seeds (the seeds are fixed). Cells expected below 5 are pooled (the chi-square approximation's rule).
P_FLOOR = 1e-3


def joint_first_two(model, prompt, temperature: float) -> torch.Tensor:
    """(V, V) the target's exact p(t1, t2 | prompt) at ``temperature``."""
    with torch.inference_mode():
        p1 = torch.softmax(model(prompt[None]).logits[0, -1].double() / temperature, dim=-1)  # (V,)
        rows = [torch.softmax(model(torch.cat([prompt, torch.tensor([t])])[None]).logits[0, -1].double() / temperature, -1)
                for t in range(SAMPLING_VOCAB)]
    return p1[:, None] * torch.stack(rows)  # (V, V)


def pooled_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.flatten() * counts.sum()
    observed = counts.flatten()
    assert observed[probs.flatten() == 0].sum() == 0
    big = expected >= 5
    obs, exp = observed[big], expected[big]
    if not big.all():  # the small cells, pooled into one
        obs, exp = torch.cat([obs, observed[~big].sum()[None]]), torch.cat([exp, expected[~big].sum()[None]])
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def test_sampled_slots_keep_the_target_distribution_of_the_first_two_tokens():
    """Two prompts alternate in the queue of a 3-slot run at temperature 1 with a Medusa chain of 2 (random heads):
    the first token comes from each slot's prefill, the second from rejection sampling of the batched verify's
    row for that slot. Each prompt's joint (t1, t2) counts must match the target's exact joint distribution."""
    model = tiny_llama_model(vocab=SAMPLING_VOCAB, seed=3)
    for p in model.parameters():  # flatter logits: every cell of the 6 x 6 joint is visited
        p.data.mul_(0.5)
    static = StaticTarget.from_hf_model(model)
    heads = random_heads(vocab=SAMPLING_VOCAB, seed=4)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 0, 5, 2, 1])]
    temperature = 1.0
    config = GenerationConfig(max_new_tokens=2, ignore_eos=True, sampling=SamplingParams(temperature=temperature))
    queue = [prompts[i % 2] for i in range(2 * SAMPLED_REQUESTS)]
    target = static.with_batch_size(3)
    proposer = for_batch(MedusaProposer.from_options(static, heads=heads, num_speculative_tokens=2), 3)
    decoder = Decoder(target, proposer, config)
    results = decoder.generate_all(queue, seeds=list(range(len(queue))))
    accepted = sum(r.counters.num_accepted_tokens for r in results)
    assert accepted > 0  # some second tokens came through an accepted draft, some through the residual
    for which, prompt in enumerate(prompts):
        counts = torch.zeros(SAMPLING_VOCAB, SAMPLING_VOCAB, dtype=torch.float64)
        for r in results[which::2]:
            counts[r.output_token_ids[0], r.output_token_ids[1]] += 1
        assert pooled_p_value(counts, joint_first_two(model, prompt, temperature)) > P_FLOOR, counts


# --- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [0, -3, 1.5])
def test_a_batch_size_below_one_is_refused_naming_the_value(tiny, batch_size):
    static, _, _ = tiny
    with pytest.raises(ValueError, match=rf"batch_size must be an integer >= 1 \(slots decoded together\), got {batch_size}"):
        static.with_batch_size(batch_size)


def test_a_cache_that_cannot_fit_is_refused_before_allocation(tiny):
    static, _, prompts = tiny
    target = static.with_batch_size(10**9)
    decoder = Decoder(target, None, GenerationConfig(max_new_tokens=8))
    # 10^9 slots x 2 layers x 2 x 2 kv heads x 16 head_dim x 29 positions x 4 bytes
    needed = 10**9 * 2 * 2 * 2 * 16 * 29 * 4
    with pytest.raises(MemoryError, match=rf"batch_size 1000000000 needs a static KV cache of {needed} bytes \(1000000000 "
                                          r"slots x 2 layers x 2 x 2 kv heads x 16 head_dim x 29 positions x 4 bytes\) but "
                                          r"cpu has \d+ bytes free; lower batch_size \(at most \d+ fit at this length\) or "
                                          r"the max length"):
        decoder.generate_all(prompts[3:4])  # 21 + 8 = 29 positions
    assert target.cache_capacity == 0  # nothing was allocated
