"""Medusa heads on stacked weights (issue #12): the proposer's batched head_logits equals the old
per-head loop, drafts are unchanged token for token, and stacking leaves the state dict, checkpoint
round trips and training as they were."""

import copy
import types

import pytest
import torch
from torch import nn

from specbench.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig
from specbench.medusa.training import train_medusa_heads
from specbench.proposers.medusa import MedusaProposer

HIDDEN, VOCAB, HEADS = 32, 96, 5
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [0, 0, 0], [1, 1, 0], [1, 1, 1]]  # depth 3 < HEADS
# fp32: the batched matmuls (baddbmm/bmm) may sum in another order than one nn.Linear per head
ATOL, RTOL = 1e-5, 1e-5


def random_heads(num_layers=1, has_vocab_projection=True, seed=0) -> MedusaHeads:
    """Every parameter non-zero (residual weights and biases included), so a wrong view shows."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = MedusaHeads(MedusaHeadsConfig(HEADS, num_layers, HIDDEN, VOCAB, has_vocab_projection))
        for name, p in heads.named_parameters():
            nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.3)
    return heads


def target_lm_head(seed=1) -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(HIDDEN, VOCAB, bias=False)


def loop_head_logits(heads: MedusaHeads, lm_head, hidden_state: torch.Tensor, depth: int) -> torch.Tensor:
    """The proposer's head_logits before issue #12: a Python loop, L ResBlocks then a projection per head."""
    x = hidden_state.to(next(heads.parameters()).dtype)  # (H,)
    hidden = torch.stack([heads.blocks[h](x) for h in range(depth)])  # (depth, H)
    if heads.lm_heads is None:
        return lm_head(hidden)  # (depth, V)
    return torch.stack([heads.lm_heads[h](hidden[h]) for h in range(depth)])  # (depth, V)


def hidden_states(n=16, seed=2) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))  # (n, H)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("has_vocab_projection", [True, False])
@pytest.mark.parametrize("depth", [1, 3, HEADS])
def test_stacked_head_logits_equal_the_per_head_loop(num_layers, has_vocab_projection, depth):
    heads = random_heads(num_layers, has_vocab_projection)
    reference = copy.deepcopy(heads)  # never stacked: its own per-head tensors
    lm_head = target_lm_head()
    proposer = MedusaProposer(heads, lm_head, num_speculative_tokens=depth)
    for x in hidden_states():
        got = proposer.head_logits(x)  # (depth, V)
        assert got.shape == (depth, VOCAB)
        torch.testing.assert_close(got, loop_head_logits(reference, lm_head, x, depth), rtol=RTOL, atol=ATOL)
    # the module's own per-head forward (training's path) sees the same weights through the views
    batch = hidden_states(4)
    stacked = heads.stack()
    expected = reference(batch, lm_head)  # (HEADS, 4, V)
    torch.testing.assert_close(heads(batch, lm_head), expected, rtol=0, atol=0)
    if has_vocab_projection:
        torch.testing.assert_close(stacked.logits(batch, HEADS), expected, rtol=RTOL, atol=ATOL)
    else:
        torch.testing.assert_close(lm_head(stacked.hidden(batch, HEADS)), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("has_vocab_projection", [True, False])
@pytest.mark.parametrize("options", [{"num_speculative_tokens": 1}, {"num_speculative_tokens": 3}, {"tree": TREE}])
def test_drafts_are_the_old_paths_token_for_token(has_vocab_projection, options):
    heads = random_heads(2, has_vocab_projection, seed=3)
    reference = copy.deepcopy(heads)
    lm_head = target_lm_head()
    proposer = MedusaProposer(heads, lm_head, **options)
    for x in hidden_states(32, seed=4):
        draft = proposer.propose({0: types.SimpleNamespace(token_ids=torch.tensor([1, 2, 3]), hidden_state=x)})[0]
        old = proposer.draft_from_logits(loop_head_logits(reference, lm_head, x, proposer.depth))
        assert torch.equal(draft.tokens, old.tokens)
        assert torch.equal(draft.parents, old.parents)


@pytest.mark.parametrize("has_vocab_projection", [True, False])
def test_stacking_keeps_the_state_dict_and_holds_no_copy(has_vocab_projection):
    heads = random_heads(2, has_vocab_projection)
    before = {k: v.clone() for k, v in heads.state_dict().items()}
    grads_before = {name: p.requires_grad for name, p in heads.named_parameters()}
    stacked = heads.stack()
    assert heads.stack() is stacked  # idempotent
    after = heads.state_dict()
    assert list(after) == list(before)
    for key in before:
        assert after[key].shape == before[key].shape and after[key].dtype == before[key].dtype, key
        assert torch.equal(after[key], before[key]), key
    assert {name: p.requires_grad for name, p in heads.named_parameters()} == grads_before
    # every parameter is a view of a stacked tensor: block l of head h is [h, l], projection h is [h]
    storages = {stacked.block_weight.untyped_storage().data_ptr(), stacked.block_bias.untyped_storage().data_ptr()}
    if has_vocab_projection:
        storages.add(stacked.vocab_weight.untyped_storage().data_ptr())
    for p in heads.parameters():
        assert p.untyped_storage().data_ptr() in storages
    assert heads.blocks[3][1].linear.weight.data_ptr() == stacked.block_weight[3, 1].data_ptr()
    assert heads.blocks[3][1].linear.bias.data_ptr() == stacked.block_bias[3, 1].data_ptr()
    if has_vocab_projection:
        assert heads.lm_heads[4].weight.data_ptr() == stacked.vocab_weight[4].data_ptr()
    # in-place updates reach the stacked tensors; a replaced parameter (a cast) restacks
    with torch.no_grad():
        heads.blocks[2][0].linear.bias.add_(1.0)
    assert heads.stack() is stacked and torch.equal(stacked.block_bias[2, 0], heads.blocks[2][0].linear.bias)
    heads.to(torch.float64)
    restacked = heads.stack()
    assert restacked is not stacked and restacked.block_weight.dtype == torch.float64
    assert heads.blocks[2][0].linear.bias.data_ptr() == restacked.block_bias[2, 0].data_ptr()


@pytest.mark.parametrize(
    "layout, has_vocab_projection, weights_format",
    [("fasterdecoding", True, "safetensors"), ("fasterdecoding", True, "pt"), ("vllm", True, "safetensors"),
     ("fasterdecoding", False, "safetensors")],
)
def test_save_load_round_trip_after_stacking(tmp_path, layout, has_vocab_projection, weights_format):
    heads = random_heads(2, has_vocab_projection)
    reference = copy.deepcopy(heads)
    MedusaProposer(heads, target_lm_head(), num_speculative_tokens=3)  # stacks the heads
    out = save_medusa_heads(heads, tmp_path / "heads", layout=layout, base_model_name_or_path="org/base",
                            weights_format=weights_format)
    loaded = load_medusa_heads(out, hidden_size=HIDDEN, vocab_size=VOCAB)
    want, got = reference.state_dict(), loaded.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    # the loaded heads stack and draft as well
    lm_head = target_lm_head()
    proposer = MedusaProposer(loaded, lm_head, num_speculative_tokens=3)
    x = hidden_states(1)[0]
    torch.testing.assert_close(proposer.head_logits(x), loop_head_logits(reference, lm_head, x, 3), rtol=RTOL, atol=ATOL)


def test_heads_stacked_by_a_proposer_still_train_and_the_proposer_sees_the_update():
    heads = random_heads(1)
    proposer = MedusaProposer(heads, None, num_speculative_tokens=2)
    with torch.inference_mode():  # stacking under inference mode must not make the parameters inference tensors
        heads.stack()
    before = {k: v.clone() for k, v in heads.state_dict().items()}
    hidden = torch.randn(4, 6, HIDDEN, generator=torch.Generator().manual_seed(5))
    tokens = torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(6))
    losses = train_medusa_heads(heads, hidden, tokens, steps=3, lr=1e-2, batch_size=8, progress=False)
    assert len(losses) == 3
    assert any(not torch.equal(v, before[k]) for k, v in heads.state_dict().items())
    x = hidden_states(1)[0]
    fresh = copy.deepcopy(heads)
    torch.testing.assert_close(proposer.head_logits(x), loop_head_logits(fresh, None, x, 2), rtol=RTOL, atol=ATOL)
