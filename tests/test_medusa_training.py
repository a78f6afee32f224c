"""Medusa head self-distillation on a tiny fp32 Llama: data alignment, training, accuracy, and the
acceptance that trained heads (with and without their ResBlock biases) reach when decoding."""

import copy

import pytest
import torch

from specbench.checkpoints.tiny import tiny_llama
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.proposers.medusa import MedusaProposer
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig
from specbench.medusa.training import (
    IGNORE_INDEX,
    _ignore_after_eos,
    collect_self_distillation,
    head_labels,
    head_topk_accuracy,
    train_medusa_heads,
)

NEW_TOKENS = 24
NUM_PROMPTS = 32


@pytest.fixture(scope="module", autouse=True)
def fast_tiny_cpu_math():
    # the heads' softmax tails underflow into denormal floats, which make CPU Adam steps ~5x slower;
    # tensors this small gain nothing from a second thread, which spin-waits on a busy 2-core runner
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (8,), generator=generator) for _ in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def data(tiny_model, prompts):
    return collect_self_distillation(tiny_model, prompts, NEW_TOKENS, batch_size=16)


@pytest.fixture(scope="module")
def trained_heads(tiny_model, data):
    config = MedusaHeadsConfig(num_heads=3, num_layers=1, hidden_size=64, vocab_size=256)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        heads = MedusaHeads(config)
    heads.init_from_lm_head(tiny_model.lm_head.weight.data)
    # a large learning rate makes few steps enough, and makes the biases carry real weight
    losses = train_medusa_heads(heads, *data, steps=300, lr=0.1, batch_size=64, seed=0, progress=False)
    assert len(losses) == 300
    return heads, losses


def _acceptance_rate(tiny_model, heads, prompts) -> float:
    target = HFTarget(tiny_model)
    proposer = MedusaProposer(heads, target.lm_head, num_speculative_tokens=3)
    decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=NEW_TOKENS))
    counters = [decoder.generate(p).counters for p in prompts]
    total = counters[0]
    for c in counters[1:]:
        total = total.merge(c)
    return total.acceptance_rate


def test_head_labels_shift_by_head_index_plus_two():
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    labels = head_labels(tokens, 2)  # (1, 5, 2)
    assert labels[0, :, 0].tolist() == [12, 13, 14, IGNORE_INDEX, IGNORE_INDEX]
    assert labels[0, :, 1].tolist() == [13, 14, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_tokens_after_eos_are_ignored():
    tokens = torch.tensor([[5, 1, 7, 5, 8], [2, 3, 4, 6, 9]])  # column 0 is a prompt token, even if EOS
    masked = _ignore_after_eos(tokens, torch.tensor([5]))
    assert masked.tolist() == [[5, 1, 7, 5, IGNORE_INDEX], [2, 3, 4, 6, 9]]


def test_collected_data_is_the_engines_greedy_output_and_hidden_state(tiny_model, prompts, data):
    hidden, tokens = data
    assert hidden.shape == (NUM_PROMPTS, NEW_TOKENS + 1, 64) and tokens.shape == (NUM_PROMPTS, NEW_TOKENS + 1)
    # prompts of different lengths share a batch (left padding); each row must match its own run
    mixed = [prompts[0], prompts[1][:3], prompts[2][:5]]
    mixed_hidden, mixed_tokens = collect_self_distillation(tiny_model, mixed, 6, batch_size=3)
    target = HFTarget(tiny_model)
    for row, prompt in enumerate(mixed):
        greedy = Decoder(target, None, GenerationConfig(max_new_tokens=6)).generate(prompt).output_token_ids
        assert mixed_tokens[row].tolist() == [int(prompt[-1])] + greedy
        # fp32, same weights, one padded batch vs one unpadded prefill: summation order only
        last_prompt_hidden = target.prefill(0, prompt).hidden_states[-1]
        torch.testing.assert_close(mixed_hidden[row, 0], last_prompt_hidden, rtol=0, atol=1e-4)
    torch.testing.assert_close(mixed_hidden[0], hidden[0, :7], rtol=0, atol=1e-4)


def test_collection_keeps_the_targets_eos_and_ignores_what_follows(prompts):
    model = tiny_llama(seed=0)  # a private copy: its generation config is changed below
    greedy = Decoder(HFTarget(model), None, GenerationConfig(max_new_tokens=12)).generate(prompts[0]).output_token_ids
    stop = next(i for i in range(2, 12) if greedy[i] not in greedy[:i])  # first occurrence, not at the start
    model.generation_config.eos_token_id = greedy[stop]
    hidden, tokens = collect_self_distillation(model, [prompts[0]], 12)
    # generation really ends at EOS (no second choice forced in its place); the row keeps its width
    assert tokens.shape == (1, 13) and hidden.shape == (1, 13, 64)
    assert tokens[0].tolist() == [int(prompts[0][-1])] + greedy[: stop + 1] + [IGNORE_INDEX] * (11 - stop)


def test_training_lowers_loss_and_accuracy_is_cumulative(trained_heads, data):
    heads, losses = trained_heads
    # start: vocab projections copy the lm_head, which predicts t + 1, not t + i + 2; 3 heads summed
    assert losses[-1] < 0.25 * losses[0]
    accuracy = head_topk_accuracy(heads, *data, k=5)  # (3, 5)
    assert accuracy.shape == (3, 5)
    assert bool((accuracy[:, 1:] >= accuracy[:, :-1]).all())  # cumulative over ranks
    # the heads fit the ~700 labelled positions per head they were trained on
    assert bool((accuracy[:, 0] >= 0.8).all())
    assert torch.equal(head_topk_accuracy(heads, *data, k=256)[:, -1], torch.ones(3))  # every token is in the top-V


def test_trained_heads_accept_far_above_random_and_need_their_biases(tiny_model, prompts, trained_heads, data):
    heads, _ = trained_heads
    evaluation = prompts[:8]  # decoding re-creates the training continuations (fp32 greedy)
    trained = _acceptance_rate(tiny_model, heads, evaluation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        random = MedusaHeads(heads.config)
        for name, p in random.named_parameters():
            torch.nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    random_rate = _acceptance_rate(tiny_model, random, evaluation)
    # random heads guess unrelated tokens: ~1/256 per token; 0.05 leaves room for skewed token counts
    assert random_rate <= 0.05
    # trained heads: >= 0.8 top-1 per head on these very continuations (checked above); a chain of
    # 3 compounds that to at least (0.8 + 0.64 + 0.51) / 3 = 0.65 when errors are independent
    assert trained >= 0.5

    no_bias = copy.deepcopy(heads)
    for blocks in no_bias.blocks:
        for block in blocks:
            block.linear.bias.data.zero_()
    dropped = _acceptance_rate(tiny_model, no_bias, evaluation)
    # vLLM dropped these biases when loading old checkpoints (docs/checkpoints.md); here that must show.
    # ~8 prompts x ~7 drafts x 3 tokens = ~170 draft tokens: 0.1 is ~17 tokens, far above tie flips
    assert dropped <= trained - 0.1
    assert bool((head_topk_accuracy(no_bias, *data, k=1) < head_topk_accuracy(heads, *data, k=1)).all())


def test_version2_heads_train_through_the_frozen_lm_head(tiny_model, data):
    config = MedusaHeadsConfig(num_heads=2, num_layers=1, hidden_size=64, vocab_size=256, has_vocab_projection=False)
    heads = MedusaHeads(config)
    lm_weight = tiny_model.lm_head.weight.detach().clone()
    before = head_topk_accuracy(heads, *data, k=1, lm_head=tiny_model.lm_head)
    losses = train_medusa_heads(heads, *data, steps=60, lr=0.03, seed=0, lm_head=tiny_model.lm_head, head_decay=0.8, progress=False)
    assert torch.equal(tiny_model.lm_head.weight, lm_weight) and tiny_model.lm_head.weight.grad is None
    assert tiny_model.lm_head.weight.requires_grad  # restored after training
    assert losses[-1] < losses[0]
    assert bool((head_topk_accuracy(heads, *data, k=1, lm_head=tiny_model.lm_head) > before).all())
