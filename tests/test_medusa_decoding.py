"""Medusa proposer end to end on a tiny fp32 Llama: lossless greedy output for chains and trees,
the accepted path of a known branch, the KV cache after tree commits, and option handling."""

import sys
import types

import pytest
import torch
from torch import nn

from specbench.checkpoints.tiny import tiny_llama
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.step_inputs import SlotInput
from specbench.engine.tree import TreeBuffers
from specbench.proposers import create_proposer
from specbench.proposers.medusa import MedusaProposer
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig

VOCAB, HIDDEN = 256, 64  # tiny_llama defaults
PROMPT = torch.tensor([3, 17, 42, 99, 7, 250, 1, 64])
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [0, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.fixture(scope="module")
def plain_output(tiny_model):
    return Decoder(HFTarget(tiny_model), None, GenerationConfig(max_new_tokens=40)).generate(PROMPT).output_token_ids


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Prompt + 48 greedy tokens: enough for 40 output tokens plus 5 heads looking ahead."""
    output = Decoder(HFTarget(tiny_model), None, GenerationConfig(max_new_tokens=48)).generate(PROMPT).output_token_ids
    return PROMPT.tolist() + output


def random_heads(num_heads=5, has_vocab_projection=True, seed=1) -> MedusaHeads:
    """Heads whose every parameter matters: non-zero residual weights and biases."""
    config = MedusaHeadsConfig(num_heads, 1, HIDDEN, VOCAB, has_vocab_projection)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = MedusaHeads(config)
        for name, p in heads.named_parameters():
            nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    return heads


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_chain_output_equals_plain_greedy(tiny_model, plain_output, k):
    target = HFTarget(tiny_model)
    proposer = MedusaProposer.from_options(target, heads=random_heads(), num_speculative_tokens=k)
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=40)).generate(PROMPT)
    assert result.output_token_ids == plain_output
    c = result.counters
    assert c.num_drafts == c.num_target_forwards  # every step after the first token carries a chain
    assert c.num_draft_tokens == c.num_drafts * k
    # tokens emitted before truncation: the prefill's token + (accepted + 1) per step
    assert 40 <= 1 + c.num_accepted_tokens + c.num_target_forwards < 40 + k + 1


def test_greedy_tree_output_equals_plain_greedy(tiny_model, plain_output):
    target = HFTarget(tiny_model)
    proposer = MedusaProposer.from_options(target, heads=random_heads(), tree=TREE)
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=40)).generate(PROMPT)
    assert result.output_token_ids == plain_output
    c = result.counters
    assert c.num_draft_tokens == c.num_drafts * 3  # a tree counts its depth (metrics.py)
    assert 40 <= 1 + c.num_accepted_tokens + c.num_target_forwards < 40 + 3 + 1


def test_version2_heads_use_the_target_lm_head(tiny_model):
    target = HFTarget(tiny_model)
    heads = random_heads(3, has_vocab_projection=False)
    proposer = MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=3)
    hidden = torch.randn(HIDDEN)
    expected = target.lm_head(torch.stack([heads.blocks[h](hidden) for h in range(3)]))  # (3, V)
    torch.testing.assert_close(proposer.head_logits(hidden), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="version 2"):
        MedusaProposer(heads, None, num_speculative_tokens=1)


class RecordingTarget(HFTarget):
    """The eager target recording the accepted path of its one slot at every commit."""

    def __init__(self, tiny_model):
        super().__init__(tiny_model)
        self.commits: list[list[int]] = []

    def commit(self, accepted):
        self.commits.append(list(accepted[0]))
        super().commit(accepted)


class OracleMedusa(MedusaProposer):
    """Knows the greedy continuation: head i puts the true token t + i + 2 at rank ``true_ranks[i]``
    (None: not among its candidates); the other ranks hold wrong tokens."""

    queues_ahead = False  # it reads the tokens' count: its steps are never queued ahead of their reads

    def __init__(self, heads, reference, true_ranks, **options):
        super().__init__(heads, None, **options)
        self.reference = reference
        self.true_ranks = true_ranks

    def step_ranks(self):
        return self.true_ranks

    def propose(self, states):
        return {slot: self.oracle_draft(state) for slot, state in states.items()}

    def oracle_draft(self, state):
        length = state.token_ids.numel()  # reference[length + i] is head i's true token
        rows = []
        for i, rank in enumerate(self.step_ranks()):
            true = self.reference[length + i]
            ranking = [(true + 1 + j) % VOCAB for j in range(5)]  # wrong tokens
            if rank is not None:
                ranking.insert(rank, true)
            logits = torch.full((VOCAB,), -1e4)
            logits[ranking] = torch.arange(len(ranking), 0, -1, dtype=torch.float)  # best first
            rows.append(logits)
        return self.draft_from_logits(torch.stack(rows))


class NoisyOracle(OracleMedusa):
    """Right at a random rank or wrong, afresh each step: acceptances of every length occur."""

    def __init__(self, heads, reference, num_heads, **options):
        super().__init__(heads, reference, None, **options)
        self.generator = torch.Generator().manual_seed(0)
        self.num_heads = num_heads

    def step_ranks(self):
        choices = (0, 0, 0, 1, 2, None)
        picks = torch.randint(len(choices), (self.num_heads,), generator=self.generator).tolist()
        return [choices[p] for p in picks]


@pytest.mark.parametrize("options", [{"num_speculative_tokens": k} for k in range(1, 6)] + [{"tree": TREE}])
def test_partly_right_drafts_keep_greedy_output(tiny_model, reference, plain_output, options):
    target = HFTarget(tiny_model)
    num_heads = options.get("num_speculative_tokens", 3)
    proposer = NoisyOracle(random_heads(), reference, num_heads, **options)
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=40)).generate(PROMPT)
    assert result.output_token_ids == plain_output
    c = result.counters
    assert c.num_draft_tokens == c.num_drafts * num_heads
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens  # both accepting and rejecting were exercised
    assert 40 <= 1 + c.num_accepted_tokens + c.num_target_forwards < 40 + num_heads + 1


@pytest.mark.parametrize(
    "options, true_ranks, accepted_path",
    [
        ({"tree": TREE}, (1, 1, 0), [(1,), (1, 1), (1, 1, 0)]),  # a full-depth branch that is not node order
        ({"tree": TREE}, (2, 1, 0), [(2,)]),  # [2, 1] is not in the tree: the branch is cut after one
        ({"tree": TREE}, (None, 0, 0), []),  # head 0 never right: nothing accepted
        ({"num_speculative_tokens": 3}, (0, 0, None), [(0,), (0, 0)]),  # a chain cut by head 2
    ],
)
def test_known_branch_is_accepted_and_the_cache_matches_a_fresh_prefill(tiny_model, options, true_ranks, accepted_path):
    steps = 5
    per_step = len(accepted_path) + 1  # accepted tokens + the target's own
    max_new = 1 + steps * per_step  # the last step ends exactly at max_new_tokens: nothing is cut
    reference_len = PROMPT.numel() + max_new + 3  # heads look up to 3 tokens past the output
    reference = PROMPT.tolist() + Decoder(HFTarget(tiny_model), None, GenerationConfig(max_new_tokens=reference_len)).generate(
        PROMPT
    ).output_token_ids
    target = RecordingTarget(tiny_model)
    proposer = OracleMedusa(random_heads(3), reference, true_ranks, **options)
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=max_new)).generate(PROMPT)

    assert result.output_token_ids == reference[PROMPT.numel() : PROMPT.numel() + max_new]
    paths = TreeBuffers.from_paths(options["tree"]).paths if "tree" in options else [(0,) * d for d in (1, 2, 3)]
    expected_nodes = [0] + [paths.index(p) + 1 for p in accepted_path]
    assert target.commits == [expected_nodes] * steps
    c = result.counters
    assert (c.num_drafts, c.num_accepted_tokens, c.num_draft_tokens) == (steps, steps * len(accepted_path), steps * 3)
    assert c.accepted_per_position == [steps] * len(accepted_path) + [0] * (3 - len(accepted_path))

    # The cache holds every output token but the last; its next-token logits must match a fresh
    # forward of the same tokens. atol 1e-4: fp32 logits of magnitude ~10 differ only by summation
    # order (~1e-6); a wrongly gathered or mispositioned K/V entry moves them by O(1) at this init.
    tokens = torch.tensor(reference[: PROMPT.numel() + max_new])
    assert target.cache_length == tokens.numel() - 1
    cached = target.verify([SlotInput(tokens[-1:], [0])]).logits[0, 0]  # (V,)
    with torch.no_grad():
        fresh = tiny_model(tokens[None]).logits[0, -1].float()  # (V,)
    torch.testing.assert_close(cached, fresh, rtol=0, atol=1e-4)


def test_options_are_checked(tiny_model):
    target = HFTarget(tiny_model)
    heads = random_heads(3)
    with pytest.raises(ValueError, match="exactly one of num_speculative_tokens .* or tree"):
        MedusaProposer.from_options(target, heads=heads)
    with pytest.raises(ValueError, match="exactly one of num_speculative_tokens .* or tree"):
        MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=2, tree=TREE)
    with pytest.raises(ValueError, match=r"must be in 1\.\.3 .* got 4"):
        MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=4)
    with pytest.raises(ValueError, match=r"is 4 deep but the checkpoint has only 3 heads"):
        MedusaProposer.from_options(target, heads=heads, tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="exactly one of heads .* or path"):
        MedusaProposer.from_options(target, num_speculative_tokens=1)
    with pytest.raises(TypeError):
        MedusaProposer.from_options(target, heads=heads, num_speculative_tokens=1, top_k=3)


def test_describe_and_registry(tiny_model):
    target = HFTarget(tiny_model)
    chain = create_proposer("medusa", target, heads=random_heads(4), num_speculative_tokens=2)
    assert isinstance(chain, MedusaProposer)
    assert chain.describe() == {"name": "medusa", "num_heads": 4, "num_speculative_tokens": 2}
    assert chain.max_draft_tokens == 2
    tree = MedusaProposer.from_options(target, heads=random_heads(4), tree=TREE)
    assert tree.describe() == {"name": "medusa", "num_heads": 4, "tree": "custom", "tree_nodes": 11, "tree_depth": 3}
    assert tree.max_draft_tokens == 11


def test_path_loads_heads_for_the_target_shape_and_dtype(monkeypatch):
    """``path=`` goes through medusa.checkpoint.load_medusa_heads (stubbed here) with the target's
    hidden size, vocabulary and dtype, and the heads end up in the target's dtype."""
    calls = []

    def load_medusa_heads(ref, *, hidden_size, vocab_size, num_heads=None, dtype=None):
        calls.append((ref, hidden_size, vocab_size, dtype))
        return random_heads(2)  # float32: from_options must cast it

    stub = types.ModuleType("specbench.checkpoints.medusa")
    stub.load_medusa_heads = load_medusa_heads
    monkeypatch.setitem(sys.modules, "specbench.medusa.checkpoint", stub)
    target = HFTarget(tiny_llama(seed=0, dtype=torch.bfloat16))
    proposer = MedusaProposer.from_options(target, path="some/medusa-ckpt", num_speculative_tokens=2)
    assert calls == [("some/medusa-ckpt", HIDDEN, VOCAB, torch.bfloat16)]
    assert {p.dtype for p in proposer.heads.parameters()} == {torch.bfloat16}
    state = types.SimpleNamespace(token_ids=PROMPT, hidden_state=torch.randn(HIDDEN, dtype=torch.bfloat16))
    draft = proposer.propose({0: state})[0]
    assert len(draft) == 2 and draft.is_chain
