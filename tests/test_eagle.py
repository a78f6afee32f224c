"""EAGLE-1/2 (its checkpoint files: test_eagle_checkpoint_files.py): the draft head matches transformers' layer and
its cached forward a from-scratch one; chains, static and dynamic trees decode losslessly on both targets; EAGLE-2
keeps the best nodes as a tree (docs/eagle.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from specbench.eagle.checkpoint import save_eagle_head
from specbench.eagle.draft_head import EagleConfig, EagleHead
from specbench.eagle.expansion import dynamic_tree_rule
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.proposer import ProposerState
from specbench.engine.static_target import StaticTarget
from specbench.medusa.trees import load_tree
from specbench.proposers import create_proposer
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.scripted import ScriptedProposer
from _prompts import random_prompt, repetitive_prompt
from test_static_target import HIDDEN, LLAMA3, VOCAB, build

MAX_NEW = 24
ATOL = 1e-4  # fp32 outputs of magnitude ~10: summation order only; a wrong position or cache entry moves them by O(1)
SMALL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 1]]
MODES = {
    "chain": dict(num_speculative_tokens=3),
    "static-tree": dict(tree=SMALL_TREE),
    "dynamic-tree": dict(top_k=3, depth=4, total_tokens=12),
}


def random_head(seed: int = 1, *, with_embed: bool = True, bias: bool = True, rope_scaling=None, std: float = 0.2) -> EagleHead:
    config = EagleConfig(HIDDEN, 128, 4, 2, VOCAB, bias=bias, rope_theta=500000.0 if rope_scaling else 10000.0,
                         rope_scaling=None if rope_scaling is None else dict(rope_scaling), max_position_embeddings=256)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(config, with_embed=with_embed)
        for name, p in head.named_parameters():
            nn.init.normal_(p, mean=1.0 if name.endswith("layernorm.weight") else 0.0, std=std)
    return head.prepare()


def head_inputs(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(length, HIDDEN, generator=gen), torch.randn(length, HIDDEN, generator=gen)  # (T, H) each


def from_scratch(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return head(embeds, features, torch.arange(embeds.shape[0]), head.new_cache())  # (T, H)


# ---------------------------------------------------------------- the draft head's forward


def test_head_layer_matches_transformers_llama_layer_without_input_norm():
    """An implementation nobody here wrote: transformers' LlamaDecoderLayer with its input norm removed."""
    head = random_head(rope_scaling=LLAMA3)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=VOCAB, num_hidden_layers=1, rope_scaling=dict(LLAMA3), rope_theta=500000.0,
                         max_position_embeddings=256, rms_norm_eps=head.config.rms_norm_eps)
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    layer.input_layernorm = nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in head.state_dict().items() if k.startswith("layers.0.")})
    embeds, features = head_inputs(14)
    with torch.inference_mode():
        x = head.fc(torch.cat([embeds, features], dim=-1))[None]  # (1, T, H)
        positions = torch.arange(14)[None]
        mask = torch.full((14, 14), -torch.inf).triu_(1)[None, None]  # (1, 1, T, T)
        want = layer(x, attention_mask=mask, position_ids=positions,
                     position_embeddings=LlamaRotaryEmbedding(config)(x, positions))[0]
    torch.testing.assert_close(from_scratch(head, embeds, features), want, atol=ATOL, rtol=0)


def test_cached_forward_with_tree_expansion_and_rollback_equals_from_scratch():
    head = random_head()
    embeds, features = head_inputs(20)
    want = from_scratch(head, embeds, features)  # (20, H)
    cache = head.new_cache(capacity=4)  # grows on the way
    got = [head(embeds[:8], features[:8], torch.arange(8), cache)]
    junk, _ = head_inputs(5, seed=9)  # a tree expansion beyond the committed 8, rolled back
    sees = torch.eye(5, dtype=torch.bool)
    head(junk, junk, torch.full((5,), 8), cache, visible=8, block_mask=sees)
    cache.truncate(8)
    got.append(head(embeds[8:13], features[8:13], torch.arange(8, 13), cache))
    cache.truncate(11)  # a rejected suffix: redo from 11
    got[-1] = got[-1][:3]
    got.append(head(embeds[11:20], features[11:20], torch.arange(11, 20), cache))
    torch.testing.assert_close(torch.cat(got), want, atol=ATOL, rtol=0)


class OracleEagle(EagleProposer):
    """Runs the EAGLE catch-up and drafting every step, but returns an oracle chain (wrong where asked), so whole
    runs of tokens are accepted and the catch-up must add several positions at once."""

    queues_ahead = False  # the oracle drafts from the accepted tokens: on a GPU too, steps are read one by one

    def __init__(self, oracle: ScriptedProposer, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.oracle, self.seen = oracle, []

    @property
    def max_draft_tokens(self) -> int:
        return self.oracle.k

    def begin_request(self, slot, prompt_ids):
        super().begin_request(slot, prompt_ids)
        self.oracle.begin_request(prompt_ids)

    def _catch_up(self, states):
        hidden, logits = super()._catch_up(states)  # (B, H), (B, V)
        state = states[0]
        self.seen.append((state.token_ids.clone(), state.hidden_states.clone(), hidden[0].clone()))
        return hidden, logits

    def propose(self, states):
        super().propose(states)
        return {0: self.oracle.propose(states[0])}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_catch_up_after_accepted_runs_equals_from_scratch(mode):
    """At every step the draft's output at the root equals a from-scratch forward over the whole history with the
    target's features: the catch-up adds exactly the accepted tokens and the rollback drops every draft node."""
    model = build("llama")
    target = HFTarget(model)
    prompt = random_prompt(10, 3)
    truth = Decoder(target, None, GenerationConfig(max_new_tokens=MAX_NEW + 8)).generate(prompt).output_token_ids
    head = random_head(with_embed=False)
    embedding = model.get_input_embeddings()
    oracle = ScriptedProposer(truth, 4, VOCAB, wrong_positions={3, 9, 10, 17})
    proposer = OracleEagle(oracle, head, target.lm_head, embedding, **MODES[mode])
    result = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
    assert result.output_token_ids == truth[:MAX_NEW]
    steps = [tokens.numel() for tokens, _, _ in proposer.seen]
    assert max(b - a for a, b in zip(steps, steps[1:])) == 5  # a whole chain of 4 accepted, plus the bonus token
    for tokens, features, hidden in proposer.seen:
        with torch.inference_mode():
            want = from_scratch(head, embedding(tokens[1:]), features)[-1]
        torch.testing.assert_close(hidden, want, atol=ATOL, rtol=0)
    tokens, features, _ = proposer.seen[-1]
    state = ProposerState(token_ids=tokens, hidden_states=features)
    first, again = EagleProposer.propose(proposer, {0: state})[0], EagleProposer.propose(proposer, {0: state})[0]
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.parents, again.parents)  # repeat calls agree


def _path_hidden(head, embedding, tokens, features, path, memo):
    """The draft's output after ``path`` (draft tokens under the root), from scratch: the history with the target's
    features, then the path's tokens, each reading the output before it (docs/eagle.md#draft-forward)."""
    if path not in memo:
        own = [_path_hidden(head, embedding, tokens, features, path[:j], memo) for j in range(len(path))]
        embeds = embedding(torch.cat([tokens[1:], torch.tensor(path, dtype=torch.long)]))
        memo[path] = from_scratch(head, embeds, torch.cat([features, *(h[None] for h in own)]))[-1]
    return memo[path]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_draft_token_follows_from_scratch_forwards_along_its_path(mode):
    """Every node the draft expanded has the output of a from-scratch draft forward along its path, and every draft
    token is the rank the rule asks for (chain: top-1; static tree: its path's rank; dynamic: one of the top_k) of
    the target's lm_head over its parent's: expansion positions, masks and features are right."""
    model = build("llama")
    target = HFTarget(model)
    head = random_head(seed=5, std=0.1)  # flatter draft distributions: EAGLE-2's frontier mixes parents
    proposer = EagleProposer.from_options(target, head=head, **MODES[mode])
    prompt = random_prompt(11, 6)
    prefill = target.prefill(0, prompt)
    tokens = torch.cat([prompt, prefill.logits[-1:].argmax(-1)])
    proposer.begin_request(0, prompt)
    expanded = []  # (path, hidden) of every node the draft ran on; a node's feature is its parent's output
    expand = proposer.captured.expand

    def recorded(tokens, features, depth, sees):  # the one slot's row of (B, W, ...)
        hidden, logits = expand(tokens, features, depth, sees)
        for token, feature, out in zip(tokens[0].tolist(), features[0], hidden[0]):
            above = next((path for path, h in expanded if torch.equal(h, feature)), ())
            expanded.append((above + (token,), out.clone()))
        return hidden, logits

    proposer.captured.expand = recorded
    draft = proposer.propose({0: ProposerState(token_ids=tokens, hidden_states=prefill.hidden_states)})[0]
    assert len(expanded) == {"chain": 2, "static-tree": 4, "dynamic-tree": 9}[mode]
    ranks = [p[-1] for p in load_tree(SMALL_TREE).paths] if mode == "static-tree" else [0] * len(draft)
    memo, paths = {}, []
    with torch.inference_mode():
        for i, (token, parent) in enumerate(zip(draft.tokens.tolist(), draft.parents.tolist())):
            above = paths[parent - 1] if parent else ()
            paths.append(above + (token,))
            logits = target.lm_head(_path_hidden(head, head.embed_tokens, tokens, prefill.hidden_states, above, memo))
            top = logits.topk(MODES[mode].get("top_k", 3)).indices.tolist()
            assert token in top if mode == "dynamic-tree" else token == top[ranks[i]], (i, token, top)
        for path, hidden in expanded:  # positions, masks and features of every expansion
            want = _path_hidden(head, head.embed_tokens, tokens, prefill.hidden_states, path, memo)
            torch.testing.assert_close(hidden, want, atol=ATOL, rtol=1e-5)  # fed-back outputs grow to ~100
            parent = _path_hidden(head, head.embed_tokens, tokens, prefill.hidden_states, path[:-1], memo)
            assert path[-1] in target.lm_head(parent).topk(MODES[mode].get("top_k", 3)).indices.tolist()
    assert max(map(len, paths)) == 3 if mode != "dynamic-tree" else max(map(len, paths)) <= 4


# ---------------------------------------------------------------- lossless decoding


def decode_losslessly(model, target, proposer, prompts: list[torch.Tensor] | None = None) -> list:
    """``proposer``'s decode results on ``target`` for ``prompts`` (None: a random and a repetitive one), each checked
    token for token against plain greedy decoding of ``model`` on the eager engine."""
    prompts = prompts or [random_prompt(12, 1), repetitive_prompt(4)]
    plain = HFTarget(model)
    truths = [Decoder(plain, None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(p).output_token_ids for p in prompts]
    decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW))
    results = [decoder.generate(p) for p in prompts]
    assert [r.output_token_ids for r in results] == truths
    return results


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_eagle_matches_plain_decoding(engine, mode):
    model = build("llama")
    target = HFTarget(model) if engine == "eager" else StaticTarget.from_hf_model(model)
    head = random_head(with_embed=mode != "chain")  # the chain drafts through the target's embedding
    proposer = create_proposer("eagle", target, head=head, **MODES[mode])
    counters = [result.counters for result in decode_losslessly(model, target, proposer)]
    assert all(c.num_draft_tokens <= c.num_drafts * proposer.max_draft_tokens for c in counters)
    assert sum(c.num_drafts for c in counters) > 0
    if engine == "static":  # one verify width per step kind: every tree padded to its reserved width
        assert all(len(widths) == 1 for widths in target.verify_widths.values()), target.verify_widths
        kind = "chain" if mode == "chain" else "tree"
        assert set(target.verify_widths[kind]) == {proposer.max_draft_tokens + 1}


def test_published_tree_from_a_checkpoint_path_is_lossless(tmp_path):
    try:
        load_tree("mc_sim_7b_63")
    except ValueError:
        pytest.skip("the published Medusa trees are not in SPECBENCH_DATA_DIR")
    model = build("llama")
    target = StaticTarget.from_hf_model(model)
    path = save_eagle_head(tmp_path / "head", random_head(seed=3), format="safetensors")
    proposer = create_proposer("eagle", target, path=str(path), tree="mc_sim_7b_63")
    assert proposer.max_draft_tokens == 63 and proposer.describe()["tree"] == "mc_sim_7b_63"
    decode_losslessly(model, target, proposer, [random_prompt(12, 2)])
    assert set(target.verify_widths["tree"]) == {64}


# ---------------------------------------------------------------- EAGLE-2's dynamic tree


def test_dynamic_tree_shape_on_real_drafts():
    model = build("llama")
    target = HFTarget(model)
    proposer = EagleProposer.from_options(target, head=random_head(), top_k=4, depth=3, total_tokens=20)
    prompt = random_prompt(15, 5)
    prefill = target.prefill(0, prompt)
    for cut in (4, 9, 15):
        tokens = torch.cat([prompt[:cut], prefill.logits[-1:].argmax(-1)]) if cut == 15 else prompt[: cut + 1]
        proposer.begin_request(0, tokens[:-1])
        draft = proposer.propose({0: ProposerState(token_ids=tokens, hidden_states=prefill.hidden_states[:cut])})[0]
        parents = draft.parents.tolist()
        assert len(draft) == 20 and draft.depth() <= 3
        assert all(0 <= p <= i for i, p in enumerate(parents))  # node i + 1's parent precedes it
        assert proposer.cache.lengths[0] == cut  # the expansion's entries are not committed


def _brute_force_pool(root_logits, table, top_k, depth):
    """EAGLE-2's candidates by the paper's rule, in plain Python: {token path: cumulative log-probability}."""
    logp = lambda logits: torch.log_softmax(logits, -1).tolist()
    def children(path, score):
        row = logp(table[path[-1]] if path else root_logits)
        best = sorted(range(len(row)), key=lambda t: -row[t])[:top_k]
        return {path + (t,): score + row[t] for t in best}
    pool = children((), 0.0)
    frontier = dict(pool)
    for _ in range(depth - 1):
        level = {}
        for path, score in frontier.items():
            level.update(children(path, score))
        pool.update(level)
        frontier = dict(sorted(level.items(), key=lambda item: -item[1])[:top_k])
    return pool


def test_dynamic_tree_keeps_the_highest_cumulative_log_probabilities():
    """Draft logits that depend only on the token (a random table): the kept nodes are exactly the best
    ``total_tokens`` of every candidate the rule scores, and each node's parent is its path's prefix."""
    vocab, top_k, depth, total = 12, 3, 4, 10
    gen = torch.Generator().manual_seed(4)
    table = 3 * torch.randn(vocab, vocab, generator=gen)  # (V, V) logits after each token
    root_logits = 3 * torch.randn(vocab, generator=gen)

    def expand(tokens, features, level, sees):
        assert sees.shape == (1, tokens.numel(), top_k * level)  # one slot
        assert sees[0, :, -top_k:].equal(torch.eye(top_k, dtype=torch.bool))
        return features, table[tokens]  # (1, W, H), (1, W, V)

    rule = dynamic_tree_rule(top_k=top_k, depth=depth, total_tokens=total)
    draft, = rule(torch.zeros(1, HIDDEN), root_logits[None], expand)
    paths = []
    for token, parent in zip(draft.tokens.tolist(), draft.parents.tolist()):
        paths.append((paths[parent - 1] if parent else ()) + (token,))
    pool = _brute_force_pool(root_logits, table, top_k, depth)
    best = sorted(pool, key=lambda path: -pool[path])[:total]
    assert set(paths) == set(best)
    assert max(len(p) for p in paths) <= depth


def test_option_errors():
    target = HFTarget(build("llama"))
    head = random_head()
    for options, message in (
        ({}, "exactly one of num_speculative_tokens"),
        ({"num_speculative_tokens": 3, "tree": SMALL_TREE}, "got num_speculative_tokens, tree"),
        ({"top_k": 3, "depth": 2}, "missing total_tokens"),
        ({"top_k": 2, "depth": 2, "total_tokens": 7}, "exceeds the 6 candidates"),
        ({"num_speculative_tokens": 0}, "must be an integer >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            EagleProposer.from_options(target, head=head, **options)
    with pytest.raises(ValueError, match="exactly one of head"):
        EagleProposer.from_options(target, num_speculative_tokens=2)
